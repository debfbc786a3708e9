//! Which requests are fenced, and which resource each one names.
//!
//! A route matches a method set and a path template such as `/inventory/{sku}`; a fenced route
//! names its resource either with a template over the path's captures (`inventory:{sku}`) or
//! with the request's `Fencing-Resource` header. Routes are tried in order; the first match
//! decides. With no routes configured, every method except GET, HEAD and OPTIONS is fenced and
//! the resource comes from the header. With routes configured, a request no route matches, with
//! a method other than GET, HEAD or OPTIONS, is fenced by header (`unmatched = "fence"`, the
//! default: a path the routes do not know may still reach a fenced handler upstream), or
//! relayed unfenced when the configuration says `unmatched = "pass"`.
//!
//! Paths are matched in their normal form (`crate::path`); a trailing slash matches as if it
//! were not there (`/inventory/sku-1/` names `inventory:sku-1`, as most frameworks route it).
//!
//! Templates are checked when the configuration is loaded (a capture in the resource template
//! that the path does not define, a character a resource name cannot hold): a bad route is a
//! start-up error, never a surprise at request time.

use std::collections::HashSet;

use http::Method;
use serde::{Deserialize, Serialize};

/// One route as written in the configuration.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Methods this route applies to. Default: every method except GET, HEAD and OPTIONS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    /// Path template: literal segments and `{name}` captures of one segment each, e.g.
    /// `/inventory/{sku}`. A final `{*name}` captures the rest of the path.
    pub path: String,
    /// Resource template over the captures (`inventory:{sku}`), or `"header"` to take the
    /// `Fencing-Resource` header. Default: `"header"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// Whether matching requests are fenced (default true). `false` lets a route pass requests
    /// untouched, e.g. to exempt a health check from a broader fenced route after it.
    #[serde(default = "yes")]
    pub fenced: bool,
}

fn yes() -> bool {
    true
}

/// What to do with a request no route matches.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Unmatched {
    /// Relay it unfenced: an explicit opt-out.
    Pass,
    /// Fence it, with the resource from the `Fencing-Resource` header (the default).
    #[default]
    Fence,
}

/// A route configuration that cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouteError {
    #[error("route {path:?}: the path template must start with '/'")]
    PathStart { path: String },
    #[error("route {path:?}: segment {segment:?} is not a literal or a {{capture}}")]
    BadSegment { path: String, segment: String },
    #[error("route {path:?}: capture {name:?} appears twice")]
    DuplicateCapture { path: String, name: String },
    #[error("route {path:?}: {{*{name}}} must be the last segment")]
    RestNotLast { path: String, name: String },
    #[error(
        "route {path:?}: the resource template uses {{{name}}}, which the path does not capture"
    )]
    UnknownCapture { path: String, name: String },
    #[error("route {path:?}: the resource template {template:?} is malformed: {reason}")]
    BadTemplate {
        path: String,
        template: String,
        reason: String,
    },
    #[error("route {path:?}: {method:?} is not an HTTP method")]
    BadMethod { path: String, method: String },
}

#[derive(Clone, Debug)]
enum Segment {
    Literal(String),
    Capture(String),
    Rest(String),
}

#[derive(Clone, Debug)]
enum Piece {
    Literal(String),
    Capture(String),
}

/// Where a fenced request's resource comes from.
#[derive(Clone, Debug)]
enum ResourceFrom {
    Header,
    Template(Vec<Piece>),
}

#[derive(Clone, Debug)]
struct Route {
    methods: Option<Vec<Method>>,
    path: Vec<Segment>,
    resource: ResourceFrom,
    fenced: bool,
}

/// The routes of one listener.
#[derive(Clone, Debug)]
pub struct Routes {
    routes: Vec<Route>,
    unmatched: Unmatched,
    /// Some route's literal segment has an upper-case letter.
    upper_literals: bool,
}

/// How a request is to be handled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Classification {
    /// Relay unchanged.
    Pass,
    /// Fenced; the resource is in the `Fencing-Resource` header.
    FenceByHeader,
    /// Fenced; the resource name built from the path (not yet validated as a name).
    FenceNamed(String),
    /// Refused: upstreams that route paths ignoring case would handle it otherwise (why).
    Ambiguous(String),
}

impl Classification {
    fn describe(&self) -> String {
        match self {
            Classification::Pass => "relayed unfenced".into(),
            Classification::FenceByHeader => "fenced by its Fencing-Resource header".into(),
            Classification::FenceNamed(r) => format!("fenced as {r:?}"),
            Classification::Ambiguous(why) => why.clone(),
        }
    }
}

/// Methods that act on a collection and everything under it (WebDAV, RFC 4918).
fn is_recursive(method: &Method) -> bool {
    *method == Method::DELETE || matches!(method.as_str(), "MOVE" | "COPY")
}

/// Methods that are not fenced by default: they do not write.
pub fn is_safe(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD || method == Method::OPTIONS
}

impl Routes {
    /// Builds and checks routes. No routes: the default rule (see the module docs).
    pub fn new(
        configs: &[RouteConfig],
        unmatched: Option<Unmatched>,
    ) -> Result<Routes, RouteError> {
        let routes = configs
            .iter()
            .map(parse_route)
            .collect::<Result<Vec<_>, _>>()?;
        let unmatched = unmatched.unwrap_or_default();
        let upper_literals = routes.iter().any(|r| {
            r.path.iter().any(
                |seg| matches!(seg, Segment::Literal(l) if l.bytes().any(|b| b.is_ascii_uppercase())),
            )
        });
        Ok(Routes {
            routes,
            unmatched,
            upper_literals,
        })
    }

    /// Decides how to handle `method path` (path without the query, as the listener reads
    /// it). The path is also read as upstreams that ignore case in paths read it (Express and
    /// ASP.NET Core route so by default); if that reading is handled otherwise, the request is
    /// [`Classification::Ambiguous`].
    pub fn classify(&self, method: &Method, path: &str) -> Classification {
        let exact = self.classify_as(method, path, false);
        // Folding case changes nothing unless the path or a route has an upper-case letter.
        if !self.upper_literals && !path.bytes().any(|b| b.is_ascii_uppercase()) {
            return exact;
        }
        let folded = self.classify_as(method, path, true);
        if folded == exact {
            return exact;
        }
        Classification::Ambiguous(format!(
            "the path {path:?} is {}, but {} by upstreams that route ignoring case (Express, \
             ASP.NET Core): spell it as the route does",
            exact.describe(),
            folded.describe()
        ))
    }

    /// [`Routes::classify`], then, when the request names more ([`crate::h1::Named`]): a
    /// method override is judged as a second method ([`Routes::with_override`]) and a
    /// `Destination` as a second path ([`Routes::with_destination`]).
    pub(crate) fn classify_request(
        &self,
        method: &Method,
        path: &str,
        named: crate::h1::Named<'_>,
        reading: crate::path::PathReading,
    ) -> Classification {
        let mut class = self.classify(method, path);
        if is_recursive(method) && self.holds_fenced(path) {
            class = Classification::Ambiguous(format!(
                "{method} {path:?} would reach every path under it, and routes fence paths \
                 under it: send it for each resource, on its own path"
            ));
        }
        if let Some((value, count)) = named.method_override {
            class = self.with_override(method, path, class, value, count);
        }
        if let Some((to, count)) = named.destination {
            let to = String::from_utf8_lossy(to);
            class = self.with_destination(method, class, &to, count, reading);
        }
        class
    }

    /// `class`, given a method override header (`value`, `count` of them): stacks that honour
    /// one (Express's method-override, Symfony, Laravel, Rails with a middleware) handle the
    /// request as that method. Kept when the override names the request's own method or one
    /// handled alike; otherwise [`Classification::Ambiguous`] (a GET turned into a PUT was
    /// relayed unfenced).
    fn with_override(
        &self,
        method: &Method,
        path: &str,
        class: Classification,
        value: &[u8],
        count: u8,
    ) -> Classification {
        if count > 1 {
            return Classification::Ambiguous("more than one method override header".into());
        }
        let named = value.trim_ascii().to_ascii_uppercase();
        let Ok(other) = Method::from_bytes(&named) else {
            return Classification::Ambiguous(format!(
                "the method override {:?} is not a method",
                String::from_utf8_lossy(value)
            ));
        };
        if other == *method {
            return class;
        }
        let there = self.classify(&other, path);
        if there == class {
            return class;
        }
        Classification::Ambiguous(format!(
            "the request is {} as {method}, but {} as {other}, the method its override header \
             names (stacks that honour the header handle it as {other}): send {other} itself",
            class.describe(),
            there.describe()
        ))
    }

    /// `class` (the request's own), given that the request also names `destination` (its
    /// `Destination` header, `count` of them: WebDAV's COPY and MOVE write there): kept when
    /// the destination's path is handled the same way, or relayed unfenced; otherwise
    /// [`Classification::Ambiguous`], saying why (a write to a fenced path under the token of
    /// another resource, or of none).
    fn with_destination(
        &self,
        method: &Method,
        class: Classification,
        destination: &str,
        count: u8,
        reading: crate::path::PathReading,
    ) -> Classification {
        if count > 1 {
            return Classification::Ambiguous("more than one Destination header".into());
        }
        // An absolute URI (RFC 4918 §10.3) or an absolute path; the query is not the path.
        let rest = destination
            .split_once("://")
            .map_or(destination, |(_, r)| r.find('/').map_or("/", |i| &r[i..]));
        let raw = rest.split(['?', '#']).next().unwrap_or("/");
        if !raw.starts_with('/') {
            return Classification::Ambiguous(format!(
                "the Destination {destination:?} names no absolute path"
            ));
        }
        let judged = match crate::path::normalize(raw, reading) {
            Ok(n) => n.map_or_else(|| raw.to_string(), |n| n.judged),
            Err(e) => return Classification::Ambiguous(format!("in the Destination: {}", e.0)),
        };
        if self.holds_fenced(&judged) {
            return Classification::Ambiguous(format!(
                "the Destination {judged:?} holds paths that routes fence: a COPY or MOVE there \
                 would write them all"
            ));
        }
        let there = self.classify(method, &judged);
        if there == Classification::Pass || there == class {
            return class;
        }
        Classification::Ambiguous(format!(
            "the Destination {judged:?} is {}, but the request's path is {}: a COPY or MOVE \
             may only write where its own path's token is judged",
            there.describe(),
            class.describe()
        ))
    }

    /// Whether `path`, which no route matches (in any method, ignoring case), is a collection
    /// above paths that a fenced route gives resources to: its segments begin one of their
    /// templates. WebDAV's DELETE, MOVE and COPY of a collection reach everything under it.
    fn holds_fenced(&self, path: &str) -> bool {
        let rest = path.strip_prefix('/').unwrap_or(path);
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let parts: Vec<&str> = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('/').collect()
        };
        let matched = self
            .routes
            .iter()
            .any(|r| match_path(&r.path, path, true).is_some());
        !matched
            && self.routes.iter().filter(|r| r.fenced).any(|r| {
                r.path.len() > parts.len()
                    && parts.iter().zip(&r.path).all(|(p, seg)| match seg {
                        Segment::Literal(l) => p.eq_ignore_ascii_case(l),
                        Segment::Capture(_) | Segment::Rest(_) => !p.is_empty(),
                    })
            })
    }

    fn classify_as(&self, method: &Method, path: &str, fold: bool) -> Classification {
        for route in &self.routes {
            let method_ok = match &route.methods {
                Some(ms) => ms.contains(method),
                None => !is_safe(method),
            };
            if !method_ok {
                continue;
            }
            let Some(captures) = match_path(&route.path, path, fold) else {
                continue;
            };
            if !route.fenced {
                return Classification::Pass;
            }
            return route.fence(&captures);
        }
        if is_safe(method) || self.unmatched == Unmatched::Pass {
            return Classification::Pass;
        }
        // A write that a fenced route's path matches, in a method the route does not list, is
        // fenced as that route fences (the upstream may serve the method at that path too),
        // never under a resource the client names.
        self.routes
            .iter()
            .filter(|r| r.fenced)
            .find_map(|r| match_path(&r.path, path, fold).map(|c| r.fence(&c)))
            .unwrap_or(Classification::FenceByHeader)
    }
}

impl Route {
    fn fence(&self, captures: &[(&str, &str)]) -> Classification {
        match &self.resource {
            ResourceFrom::Header => Classification::FenceByHeader,
            ResourceFrom::Template(pieces) => Classification::FenceNamed(render(pieces, captures)),
        }
    }
}

fn parse_route(c: &RouteConfig) -> Result<Route, RouteError> {
    let path_err = || RouteError::PathStart {
        path: c.path.clone(),
    };
    let rest = c.path.strip_prefix('/').ok_or_else(path_err)?;
    let mut segments = Vec::new();
    let mut names = HashSet::new();
    let parts: Vec<&str> = if rest.is_empty() {
        Vec::new()
    } else {
        rest.split('/').collect()
    };
    for (i, seg) in parts.iter().enumerate() {
        let parsed = match seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            Some(inner) => {
                let (rest_capture, name) = match inner.strip_prefix('*') {
                    Some(n) => (true, n),
                    None => (false, inner),
                };
                if name.is_empty()
                    || !name
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
                {
                    return Err(RouteError::BadSegment {
                        path: c.path.clone(),
                        segment: seg.to_string(),
                    });
                }
                if !names.insert(name.to_string()) {
                    return Err(RouteError::DuplicateCapture {
                        path: c.path.clone(),
                        name: name.to_string(),
                    });
                }
                if rest_capture {
                    if i + 1 != parts.len() {
                        return Err(RouteError::RestNotLast {
                            path: c.path.clone(),
                            name: name.to_string(),
                        });
                    }
                    Segment::Rest(name.to_string())
                } else {
                    Segment::Capture(name.to_string())
                }
            }
            None if seg.contains(['{', '}']) => {
                return Err(RouteError::BadSegment {
                    path: c.path.clone(),
                    segment: seg.to_string(),
                });
            }
            None => Segment::Literal(seg.to_string()),
        };
        segments.push(parsed);
    }
    let resource = match c.resource.as_deref() {
        None | Some("header") => ResourceFrom::Header,
        Some(t) => ResourceFrom::Template(parse_template(&c.path, t, &names)?),
    };
    let methods = match &c.methods {
        None => None,
        Some(ms) => Some(
            ms.iter()
                .map(|m| {
                    Method::from_bytes(m.as_bytes())
                        .ok()
                        .filter(|_| m.bytes().all(|b| b.is_ascii_uppercase()))
                        .ok_or_else(|| RouteError::BadMethod {
                            path: c.path.clone(),
                            method: m.clone(),
                        })
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(Route {
        methods,
        path: segments,
        resource,
        fenced: c.fenced,
    })
}

fn parse_template(path: &str, t: &str, names: &HashSet<String>) -> Result<Vec<Piece>, RouteError> {
    let bad = |reason: &str| RouteError::BadTemplate {
        path: path.to_string(),
        template: t.to_string(),
        reason: reason.to_string(),
    };
    let mut pieces = Vec::new();
    let mut rest = t;
    while !rest.is_empty() {
        match rest.find('{') {
            Some(0) => {
                let end = rest.find('}').ok_or_else(|| bad("an unclosed '{'"))?;
                let name = &rest[1..end];
                if !names.contains(name) {
                    return Err(RouteError::UnknownCapture {
                        path: path.to_string(),
                        name: name.to_string(),
                    });
                }
                pieces.push(Piece::Capture(name.to_string()));
                rest = &rest[end + 1..];
            }
            found => {
                let end = found.unwrap_or(rest.len());
                let lit = &rest[..end];
                if lit.contains('}') {
                    return Err(bad("a '}' without '{'"));
                }
                if let Some(c) = lit
                    .chars()
                    .find(|&c| fencing::ResourceName::new(&c.to_string()).is_err())
                {
                    return Err(bad(&format!("{c:?} cannot appear in a resource name")));
                }
                pieces.push(Piece::Literal(lit.to_string()));
                rest = &rest[end..];
            }
        }
    }
    if pieces.is_empty() {
        return Err(bad("it is empty"));
    }
    Ok(pieces)
}

/// Matches `path` against a template (its literals ignoring ASCII case if `fold`); returns the
/// captures (name, value).
fn match_path<'r, 'p>(
    template: &'r [Segment],
    path: &'p str,
    fold: bool,
) -> Option<Vec<(&'r str, &'p str)>> {
    let rest = path.strip_prefix('/')?;
    let rest = if rest.len() > 1 {
        rest.strip_suffix('/').unwrap_or(rest)
    } else {
        rest
    };
    let mut parts: Vec<&'p str> = if rest.is_empty() {
        Vec::new()
    } else {
        rest.split('/').collect()
    };
    let mut captures = Vec::new();
    let mut i = 0;
    for seg in template {
        match seg {
            Segment::Literal(l) => {
                let part = parts.get(i)?;
                let same = if fold {
                    part.eq_ignore_ascii_case(l)
                } else {
                    part == l
                };
                if !same {
                    return None;
                }
            }
            Segment::Capture(name) => {
                let v = parts.get(i).filter(|v| !v.is_empty())?;
                captures.push((name.as_str(), *v));
            }
            Segment::Rest(name) => {
                if i >= parts.len() {
                    return None;
                }
                let start = parts[..i].iter().map(|p| p.len() + 1).sum::<usize>();
                captures.push((name.as_str(), &rest[start..]));
                parts.truncate(i + 1);
                i = parts.len();
                continue;
            }
        }
        i += 1;
    }
    (i == parts.len()).then_some(captures)
}

fn render(pieces: &[Piece], captures: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for p in pieces {
        match p {
            Piece::Literal(l) => out.push_str(l),
            Piece::Capture(name) => {
                let v = captures
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or("", |(_, v)| *v);
                out.push_str(v);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(methods: Option<&[&str]>, path: &str, resource: Option<&str>) -> RouteConfig {
        RouteConfig {
            methods: methods.map(|ms| ms.iter().map(|m| m.to_string()).collect()),
            path: path.into(),
            resource: resource.map(str::to_string),
            fenced: true,
        }
    }

    #[test]
    fn without_routes_writes_are_fenced_by_header_and_reads_pass() {
        let r = Routes::new(&[], None).unwrap();
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert_eq!(r.classify(&m, "/anything"), Classification::FenceByHeader);
        }
        for m in [Method::GET, Method::HEAD, Method::OPTIONS] {
            assert_eq!(r.classify(&m, "/anything"), Classification::Pass);
        }
    }

    #[test]
    fn templates_name_the_resource_and_the_first_match_wins() {
        let r = Routes::new(
            &[
                RouteConfig {
                    fenced: false,
                    ..route(Some(&["POST"]), "/inventory/health", None)
                },
                route(None, "/inventory/{sku}", Some("inventory:{sku}")),
                route(
                    Some(&["POST"]),
                    "/payments/{account}/charges/{id}",
                    Some("pay/{account}"),
                ),
                route(None, "/files/{*path}", Some("file:{path}")),
                route(Some(&["PUT"]), "/by-header", None),
            ],
            None,
        )
        .unwrap();
        let named = |s: &str| Classification::FenceNamed(s.to_string());
        assert_eq!(
            r.classify(&Method::PUT, "/inventory/sku-1"),
            named("inventory:sku-1")
        );
        assert_eq!(
            r.classify(&Method::POST, "/inventory/health"),
            Classification::Pass
        );
        assert_eq!(
            r.classify(&Method::GET, "/inventory/sku-1"),
            Classification::Pass
        );
        assert_eq!(
            r.classify(&Method::POST, "/payments/acme/charges/7"),
            named("pay/acme")
        );
        // A method the route does not list: fenced as the route fences its path, not by a
        // header the client chose.
        assert_eq!(
            r.classify(&Method::PUT, "/payments/acme/charges/7"),
            named("pay/acme")
        );
        assert_eq!(
            r.classify(&Method::DELETE, "/files/a/b/c.txt"),
            named("file:a/b/c.txt")
        );
        assert_eq!(
            r.classify(&Method::PUT, "/by-header"),
            Classification::FenceByHeader
        );
        // A trailing slash matches as if it were not there.
        assert_eq!(
            r.classify(&Method::PUT, "/inventory/sku-1/"),
            named("inventory:sku-1")
        );
        // Unmatched writes are fenced by header, and segments must match exactly; unmatched
        // reads pass.
        for p in [
            "/inventory/sku-1/extra",
            "/inventory/",
            "/inventory//",
            "/elsewhere",
        ] {
            assert_eq!(
                r.classify(&Method::POST, p),
                Classification::FenceByHeader,
                "{p}"
            );
        }
        assert_eq!(r.classify(&Method::GET, "/elsewhere"), Classification::Pass);
        let open = Routes::new(&[route(None, "/x", None)], Some(Unmatched::Pass)).unwrap();
        assert_eq!(
            open.classify(&Method::POST, "/elsewhere"),
            Classification::Pass
        );
    }

    #[test]
    fn bad_routes_are_refused_with_the_reason() {
        let cases = [
            (route(None, "inventory/{sku}", None), "must start with '/'"),
            (route(None, "/inventory/{sku", None), "is not a literal"),
            (route(None, "/a/{x}/{x}", None), "appears twice"),
            (
                route(None, "/a/{*rest}/b", None),
                "must be the last segment",
            ),
            (
                route(None, "/a/{sku}", Some("inventory:{id}")),
                "does not capture",
            ),
            (
                route(None, "/a/{sku}", Some("inventory {sku}")),
                "cannot appear in a resource name",
            ),
            (route(None, "/a/{sku}", Some("inv:{sku")), "unclosed"),
            (route(Some(&["post"]), "/a", None), "is not an HTTP method"),
        ];
        for (config, needle) in cases {
            let err = Routes::new(std::slice::from_ref(&config), None)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{config:?}: {err}");
        }
    }

    /// Express and ASP.NET Core route `/Inventory/sku-1` to `/inventory/{sku}`: a path whose
    /// case decides how it is handled is refused (it was fenced by the header before).
    #[test]
    fn a_path_that_ignoring_case_routes_elsewhere_is_ambiguous() {
        let unfenced = RouteConfig {
            fenced: false,
            ..route(Some(&["POST"]), "/Health", None)
        };
        let r = Routes::new(
            &[
                unfenced,
                route(None, "/inventory/{sku}", Some("inventory:{sku}")),
                route(None, "/{x}", Some("any:{x}")),
            ],
            None,
        )
        .unwrap();
        for (method, p) in [
            (Method::PUT, "/Inventory/sku-1"),
            (Method::PUT, "/INVENTORY/sku-1/"),
            // `/health` is fenced as `any:health`, but a case-blind upstream takes it for the
            // unfenced `/Health`.
            (Method::POST, "/health"),
        ] {
            let got = r.classify(&method, p);
            assert!(
                matches!(&got, Classification::Ambiguous(why) if why.contains("ignoring case")),
                "{p}: {got:?}"
            );
        }
        // Captures keep their case; spelled as the routes do, nothing changes.
        assert_eq!(
            r.classify(&Method::PUT, "/inventory/SKU-1"),
            Classification::FenceNamed("inventory:SKU-1".into())
        );
        assert_eq!(r.classify(&Method::POST, "/Health"), Classification::Pass);
        assert_eq!(
            r.classify(&Method::GET, "/Inventory/x"),
            Classification::Pass
        );
    }

    /// WebDAV's COPY and MOVE write where their `Destination` header says: a destination
    /// fenced otherwise than the request's own path is refused (a MOVE of a scratch file over
    /// `inventory:sku1` under the scratch file's token wrote it before).
    #[test]
    fn a_destination_is_judged_as_a_second_path() {
        let unfenced = RouteConfig {
            fenced: false,
            ..route(None, "/public/{*rest}", None)
        };
        let r = Routes::new(
            &[
                route(None, "/inventory/{sku}", Some("inventory:{sku}")),
                unfenced,
            ],
            None,
        )
        .unwrap();
        let strict = crate::path::PathReading::Strict;
        let m = Method::from_bytes(b"MOVE").unwrap();
        let with = |path: &str, destination: &str| {
            r.with_destination(&m, r.classify(&m, path), destination, 1, strict)
        };
        let refused = |c: Classification| matches!(c, Classification::Ambiguous(_));
        for (path, destination) in [
            ("/inventory/tmp", "http://x/inventory/sku1"),
            ("/inventory/tmp", "/inventory/sku1"),
            ("/public/x", "http://x/inventory/sku1"),
            ("/public/x", "http://x/public/../inventory/sku1?q"),
            ("/inventory/tmp", "http://x/elsewhere"),
            ("/inventory/tmp", "http://x/inventory%2Fsku1"),
            ("/inventory/tmp", "sku1"),
        ] {
            assert!(refused(with(path, destination)), "{path} -> {destination}");
        }
        assert_eq!(
            with("/inventory/sku1", "http://x/inventory/sku1/"),
            Classification::FenceNamed("inventory:sku1".into())
        );
        assert_eq!(
            with("/inventory/sku1", "/public/archive/sku1"),
            Classification::FenceNamed("inventory:sku1".into())
        );
        assert_eq!(with("/public/a", "/public/b"), Classification::Pass);
        let two = r.with_destination(&m, Classification::Pass, "/public/b", 2, strict);
        assert!(refused(two));
    }

    /// A GET whose `X-HTTP-Method-Override` says PUT is a PUT to stacks that honour it: judged
    /// as both, refused when they differ (it was relayed unfenced as a GET).
    #[test]
    fn a_method_override_is_judged_as_a_second_method() {
        let r = Routes::new(
            &[route(None, "/inventory/{sku}", Some("inventory:{sku}"))],
            None,
        )
        .unwrap();
        let strict = crate::path::PathReading::Strict;
        let with = |method: Method, value: &[u8], count: u8| {
            let named = crate::h1::Named {
                destination: None,
                method_override: Some((value, count)),
            };
            r.classify_request(&method, "/inventory/sku1", named, strict)
        };
        let refused = |c: Classification| matches!(c, Classification::Ambiguous(_));
        assert!(refused(with(Method::GET, b"PUT", 1)));
        assert!(refused(with(Method::GET, b" delete ", 1)));
        assert!(
            refused(with(Method::POST, b"GET", 1)),
            "a write judged as a read"
        );
        assert!(refused(with(Method::PUT, b"PUT", 2)));
        assert!(refused(with(Method::GET, b"P U T", 1)));
        let named = Classification::FenceNamed("inventory:sku1".into());
        assert_eq!(with(Method::POST, b"PATCH", 1), named);
        assert_eq!(with(Method::PUT, b"put", 1), named);
        assert_eq!(with(Method::GET, b"HEAD", 1), Classification::Pass);
    }

    /// WebDAV's DELETE, MOVE and COPY of a collection reach everything under it: a collection
    /// above fenced paths is refused as their source or destination (a second breaker deleted
    /// `/inventory/` and moved a collection over it, under a resource of its own choosing).
    #[test]
    fn a_collection_above_fenced_paths_is_refused_to_recursive_methods() {
        let r = Routes::new(
            &[
                route(None, "/inventory/{sku}", Some("inventory:{sku}")),
                route(None, "/shelves/{id}/items/{sku}", Some("shelf:{id}")),
            ],
            None,
        )
        .unwrap();
        let strict = crate::path::PathReading::Strict;
        let refused = |c: Classification| matches!(c, Classification::Ambiguous(_));
        let go = |method: &[u8], path: &str, to: Option<&str>| {
            let m = Method::from_bytes(method).unwrap();
            let named = crate::h1::Named {
                destination: to.map(|t| (t.as_bytes(), 1)),
                method_override: None,
            };
            r.classify_request(&m, path, named, strict)
        };
        for path in [
            "/inventory/",
            "/inventory",
            "/",
            "/shelves/7",
            "/shelves/7/items/",
            "/Inventory/",
        ] {
            assert!(refused(go(b"DELETE", path, None)), "DELETE {path}");
            assert!(
                refused(go(b"MOVE", path, Some("/elsewhere/"))),
                "MOVE {path}"
            );
        }
        assert!(refused(go(
            b"MOVE",
            "/other/dir/",
            Some("http://x/inventory/")
        )));
        assert!(refused(go(b"COPY", "/other/dir/", Some("/"))));
        // A resource of its own, a path beside the routes, and other methods are as before.
        assert_eq!(
            go(b"DELETE", "/inventory/sku1", None),
            Classification::FenceNamed("inventory:sku1".into())
        );
        assert_eq!(
            go(b"DELETE", "/elsewhere/x", None),
            Classification::FenceByHeader
        );
        assert_eq!(
            go(b"POST", "/inventory", None),
            Classification::FenceByHeader
        );
    }
}

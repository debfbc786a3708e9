//! AcquireAll on the wire: a set of resources, all granted in one commit or none.

use lockd_core::{AcquireAllOutcome, AcquireAllRequest};
use lockd_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::{LockApi, Served, as_spelled, audit_grant};
use crate::status::invalid_argument;

impl LockApi {
    pub(super) async fn acquire_all_here(
        &self,
        request: Request<pb::AcquireAllRequest>,
    ) -> Result<(Response<pb::AcquireAllResponse>, &'static str), Status> {
        // Every member must be the caller's to use: one it may not use refuses the set.
        let names = request.get_ref().resources.iter().map(String::as_str);
        let who = self.admit_all(&request, names)?;
        let peer = request.remote_addr();
        let (driver, r) = match self
            .serve(request, who.as_deref(), |mut c, r| async move {
                c.acquire_all(r).await
            })
            .await?
        {
            Served::Local(driver, r) => (driver, r),
            Served::Remote(answer) => return Ok((answer, "forwarded")),
        };
        let resources = r
            .resources
            .iter()
            .enumerate()
            .map(|(i, name)| {
                fencing::ResourceName::new(name).map_err(|e| {
                    invalid_argument(&lockd_core::InvalidArgument::Set(format!(
                        "resources[{i}]: invalid resource name: {e}"
                    )))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let scope = who.as_ref().map_or("", |w| w.name.as_str());
        let request_id = self.request_id(&r.request_id, scope)?;
        let holder = self.holder(&r.holder, who.as_deref())?;
        let holder_text = holder.as_str().to_string();
        let req = AcquireAllRequest {
            resources,
            request_id,
            holder,
            ttl_ms: r.ttl_ms,
        };
        let outcome = driver
            .acquire_all(req)
            .await
            .map_err(|e| as_spelled(e, &r.request_id))?;
        let (grants, duplicate, result) = match outcome {
            AcquireAllOutcome::Granted(grants) => (
                grants.into_iter().map(|g| (g, true)).collect(),
                false,
                "granted",
            ),
            AcquireAllOutcome::Duplicate(grants) => (grants, true, "duplicate"),
            AcquireAllOutcome::Busy { resource, busy } => {
                let response = pb::AcquireAllResponse {
                    outcome: Some(pb::acquire_all_response::Outcome::NotGranted(Self::busy(
                        &driver,
                        pb::not_granted::Reason::Busy,
                        Some(busy),
                    ))),
                    busy_resource: resource.as_str().to_string(),
                };
                return Ok((Response::new(response), "busy"));
            }
        };
        for (grant, _) in &grants {
            audit_grant(
                grant,
                &holder_text,
                who.as_deref(),
                peer,
                result,
                Some(grants.len()),
            );
        }
        let leases = grants
            .iter()
            .map(|(g, held)| self.lease(&driver, g, duplicate, *held))
            .collect();
        let response = pb::AcquireAllResponse {
            outcome: Some(pb::acquire_all_response::Outcome::Granted(pb::LeaseSet {
                leases,
            })),
            busy_resource: String::new(),
        };
        Ok((Response::new(response), result))
    }
}

package dev.lockd.client;

import io.grpc.ChannelCredentials;
import io.grpc.InsecureChannelCredentials;
import io.grpc.Metadata;
import io.grpc.TlsChannelCredentials;
import java.io.IOException;
import java.net.InetAddress;
import java.net.URI;
import java.net.URISyntaxException;
import java.net.UnknownHostException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Pattern;

/** Checked connection settings of a client; everything here is checked before any call. */
final class Settings {
    static final String DEFAULT_ENDPOINT = "http://127.0.0.1:7420";
    static final Metadata.Key<String> AUTHORIZATION = Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
    private static final Pattern RESOURCE = Pattern.compile("[A-Za-z0-9\\-_.:/@]{1,256}");
    private static final Pattern IPV4 = Pattern.compile("\\d{1,3}(\\.\\d{1,3}){3}");

    record Endpoint(String url, String host, int port, boolean tls, boolean loopback) {
        String target() {
            return host.contains(":") ? "[" + host + "]:" + port : host + ":" + port;
        }
    }

    final List<Endpoint> endpoints;
    final boolean tls;
    final ChannelCredentials credentials;
    final Metadata headers;
    final String holder;

    private Settings(List<Endpoint> endpoints, boolean tls, ChannelCredentials credentials, Metadata headers,
            String holder) {
        this.endpoints = endpoints;
        this.tls = tls;
        this.credentials = credentials;
        this.headers = headers;
        this.holder = holder;
    }

    static void checkResource(String resource) {
        if (resource == null || !RESOURCE.matcher(resource).matches()) {
            throw new InvalidArgumentException("bad resource name '" + resource
                    + "': 1-256 bytes, allowed are ASCII letters, digits and - _ . : / @");
        }
    }

    static boolean isLoopback(String host) {
        if (host.equalsIgnoreCase("localhost")) {
            return true;
        }
        if (!IPV4.matcher(host).matches() && !host.contains(":")) {
            return false; // a name: never resolved here
        }
        try {
            return InetAddress.getByName(host).isLoopbackAddress(); // a literal: no lookup
        } catch (UnknownHostException e) {
            return false;
        }
    }

    static Endpoint parseEndpoint(String url) {
        if (url == null || url.isBlank()) {
            throw new EndpointException("bad endpoint '" + url + "': expected http://HOST:PORT or https://HOST:PORT");
        }
        URI uri;
        try {
            uri = new URI(url.strip());
        } catch (URISyntaxException e) {
            throw new EndpointException("bad endpoint '" + url + "': " + e.getMessage());
        }
        String scheme = uri.getScheme();
        if (scheme == null || !(scheme.equals("http") || scheme.equals("https")) || uri.getHost() == null
                || uri.getHost().isEmpty()) {
            throw new EndpointException("bad endpoint '" + url + "': expected http://HOST:PORT or https://HOST:PORT");
        }
        String path = uri.getRawPath();
        if ((path != null && !path.isEmpty() && !path.equals("/")) || uri.getRawQuery() != null
                || uri.getRawFragment() != null || uri.getRawUserInfo() != null) {
            throw new EndpointException("bad endpoint '" + url + "': only a scheme, a host and a port");
        }
        boolean tls = scheme.equals("https");
        int port = uri.getPort() == -1 ? (tls ? 443 : 80) : uri.getPort();
        String host = uri.getHost();
        if (host.startsWith("[") && host.endsWith("]")) {
            host = host.substring(1, host.length() - 1);
        }
        return new Endpoint(url.strip(), host, port, tls, isLoopback(host));
    }

    private static byte[] read(Path path, String what) {
        try {
            return Files.readAllBytes(path);
        } catch (IOException e) {
            throw new InvalidArgumentException("cannot read the " + what + " " + path + ": " + e, e);
        }
    }

    /** Reads PEM certificates, so a bad file is refused here rather than at the first call. */
    private static void certificates(Path path, String what) {
        byte[] bytes = read(path, what);
        try {
            var certs = java.security.cert.CertificateFactory.getInstance("X.509")
                    .generateCertificates(new java.io.ByteArrayInputStream(bytes));
            if (certs.isEmpty()) {
                throw new InvalidArgumentException("the " + what + " " + path + " holds no certificate");
            }
        } catch (java.security.cert.CertificateException e) {
            throw new InvalidArgumentException("the " + what + " " + path + " is not a PEM certificate: "
                    + e.getMessage(), e);
        }
    }

    static Settings of(List<String> urls, Path ca, Path cert, Path key, String token, Path tokenFile,
            String holder) {
        if (urls == null) {
            String env = System.getenv("LOCKD_ENDPOINT");
            urls = new ArrayList<>();
            for (String u : (env == null || env.isBlank() ? DEFAULT_ENDPOINT : env).split(",")) {
                if (!u.isBlank()) {
                    urls.add(u.strip());
                }
            }
        }
        List<Endpoint> parsed = new ArrayList<>();
        for (String u : urls) {
            parsed.add(parseEndpoint(u));
        }
        if (parsed.isEmpty()) {
            throw new EndpointException("no endpoint given");
        }
        boolean tls = parsed.get(0).tls();
        for (Endpoint e : parsed) {
            if (e.tls() != tls) {
                throw new EndpointException("the endpoints mix http:// and https://: use one scheme");
            }
        }
        if ((cert == null) != (key == null)) {
            throw new InvalidArgumentException(
                    "a client certificate needs its key, and a key its certificate (clientCert(cert, key))");
        }
        if (!tls && (ca != null || cert != null)) {
            throw new EndpointException("TLS files are given but the endpoints are http://; use https://");
        }
        ChannelCredentials credentials = InsecureChannelCredentials.create();
        if (tls) {
            TlsChannelCredentials.Builder b = TlsChannelCredentials.newBuilder();
            try {
                if (ca != null) {
                    certificates(ca, "CA file");
                    b.trustManager(ca.toFile());
                }
                if (cert != null) {
                    certificates(cert, "client certificate");
                    String pem = new String(read(key, "client key"), StandardCharsets.US_ASCII);
                    if (pem.contains("BEGIN RSA PRIVATE KEY") || pem.contains("BEGIN EC PRIVATE KEY")) {
                        throw new InvalidArgumentException("the client key " + key + " is not PKCS#8: convert it with "
                                + "`openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8`");
                    }
                    if (!pem.contains("PRIVATE KEY-----")) {
                        throw new InvalidArgumentException("the client key " + key + " is not a PEM private key");
                    }
                    b.keyManager(cert.toFile(), key.toFile());
                }
            } catch (IOException | IllegalArgumentException e) {
                throw new InvalidArgumentException("bad TLS files: " + e.getMessage(), e);
            }
            credentials = b.build();
        }
        if (token != null && tokenFile != null) {
            throw new InvalidArgumentException("give a bearer token or a token file, not both");
        }
        if (tokenFile != null) {
            token = new String(read(tokenFile, "token file"), StandardCharsets.US_ASCII);
        }
        Metadata headers = new Metadata();
        if (token != null) {
            token = token.strip();
            if (token.isEmpty() || !token.chars().allMatch(c -> c >= 33 && c <= 126)) {
                throw new InvalidArgumentException("bearer token: it must be printable ASCII without spaces");
            }
            if (!tls && !parsed.stream().allMatch(Endpoint::loopback)) {
                throw new EndpointException(
                        "bearer token: not sent over plaintext to another host; use an https:// endpoint");
            }
            headers.put(AUTHORIZATION, "Bearer " + token);
        }
        return new Settings(List.copyOf(parsed), tls, credentials, headers,
                holder != null && !holder.isEmpty() ? holder : defaultHolder());
    }

    static String defaultHolder() {
        String host;
        try {
            host = InetAddress.getLocalHost().getHostName();
        } catch (UnknownHostException e) {
            host = "unknown";
        }
        return host + ":" + ProcessHandle.current().pid();
    }
}

// An inventory service on Node.js's http module, for the bypass catalogue
// (tests/tests/proxy_http/stacks.rs). It routes as Express does by default: the path of
// `new URL(req.url, base)` (a WHATWG URL parser: `\` is `/`, `#` ends the path, `%2e`
// segments are dot segments), matched ignoring case and a trailing slash, the parameter
// percent-decoded; and an `X-HTTP-Method-Override` header taken for the method, as
// method-override middlewares do. PUT /inventory/:sku stores the body under the sku, GET
// answers it (404 when there is none). Prints its port, then serves until killed.
'use strict';
const http = require('node:http');

const route = /^\/inventory\/([^/]+)\/?$/i;
const store = new Map();

// With a Content-Length (Node.js chunks a body whose head went out first).
function answer(res, status, body) {
  res.statusCode = status;
  res.end(body);
}

const server = http.createServer((req, res) => {
  const { pathname } = new URL(req.url, 'http://upstream');
  const m = route.exec(pathname);
  let sku;
  try {
    sku = m && decodeURIComponent(m[1]);
  } catch {
    sku = null;
  }
  if (!sku) {
    answer(res, 404, 'no such route\n');
    return;
  }
  const method = (req.headers['x-http-method-override'] || req.method).toUpperCase();
  if (method === 'PUT') {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      store.set(sku, Buffer.concat(chunks));
      answer(res, 200, 'stored\n');
    });
    return;
  }
  if (!store.has(sku)) {
    answer(res, 404, 'none\n');
    return;
  }
  answer(res, 200, store.get(sku));
});
server.listen(0, '127.0.0.1', () => console.log(server.address().port));

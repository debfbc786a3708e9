// The zombie scenario with node-postgres, declaring tokens its idiomatic way: the `options`
// start-up parameter. Usage: node pg_zombie.js HOST PORT. Prints one JSON object per case.
const { Client } = require('pg');

const [host, port] = process.argv.slice(2);
const UPDATE = 'UPDATE acct SET owner = $1 WHERE id = 1';

async function connect(token) {
  const c = new Client({
    host, port: Number(port), user: 'postgres', database: 'postgres',
    options: `-c fencing.resource=acct:1 -c fencing.token=${token}`,
  });
  // A connection PostgreSQL ended emits an error event; the case's own promise reports it.
  c.on('error', () => {});
  await c.connect();
  return c;
}

async function report(name, promise) {
  try {
    await promise;
    console.log(JSON.stringify({ case: name, ok: true }));
  } catch (e) {
    console.log(JSON.stringify({ case: name, ok: false, sqlstate: e.code || null, message: String(e.message) }));
  }
}

(async () => {
  const a = await connect(41);
  await a.query('BEGIN');
  await a.query(UPDATE, ['A']);
  const b = await connect(42);
  await report('newer_write', b.query(UPDATE, ['B']));
  await report('zombie_commit', a.query('COMMIT'));
  const c = await connect(41);
  await report('stale_autocommit', c.query(UPDATE, ['C']));
  const d = await connect(42);
  await report('current_write', d.query(UPDATE, ['D']));
  for (const x of [b, c, d]) await x.end();
  process.exit(0);
})().catch((e) => { console.error(e); process.exit(1); });

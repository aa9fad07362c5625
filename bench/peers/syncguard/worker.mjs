// SyncGuard processes for the pglease bench's "mixed" scenario
// (bench/mixed.go starts them): `loops` concurrent lock() loops, each
// taking one of `keys` (chosen at random every time) with an empty
// function, for `durationMs`, with SyncGuard 2.5.2's defaults (ttl 30 s,
// acquisition timeout 5 s, retry 100 ms exponential with equal jitter).
//
//   node worker.mjs   (one JSON spec line on stdin; see below)
//
// Which SyncGuard runs: the real package when `syncguard` resolves from
// here (npm install syncguard@2.5.2 in this folder), else this file's
// replica of its lock() on its PostgreSQL backend (the "impl" it reports
// says which). The replica sends SyncGuard 2.5.2's statements, in its
// order, over the same client (postgres.js 3), and retries as its lock()
// does (syncguard-facts.md §1.2, §4.2): acquire is BEGIN; advisory xact
// lock; now(); SELECT the row; fence counter insert and increment; row
// upsert; COMMIT (BEGIN … COMMIT with no write when the key is held);
// release is BEGIN; now(); SELECT … FOR UPDATE by lockId; DELETE; COMMIT.
// No LISTEN anywhere: a waiter learns of a release only by polling.
//
// Protocol, as the bench's Go workers: the first stdin line is the spec
// {host, port, user, password, database, ssl, schema, app, keys, loops,
// durationMs}; the worker connects, takes each key once, prints
// {"ready":true,"impl":…}; on a "go" line it runs and prints one JSON
// report line, then exits. Nothing it prints names a key or a lockId.
import { randomBytes } from "node:crypto";
import { createInterface } from "node:readline";
import postgres from "postgres";

const TTL_MS = 30000; // BACKEND_DEFAULTS.ttlMs
const TOLERANCE_MS = 1000; // TIME_TOLERANCE_MS
const ACQ = { maxRetries: 10, retryDelayMs: 100, timeoutMs: 5000 }; // LOCK_DEFAULTS (exponential, equal jitter)

class LockError extends Error {
  constructor(code, msg) {
    super(msg);
    this.code = code;
  }
}

const isLive = (expiresAtMs, nowMs) => expiresAtMs > nowMs - TOLERANCE_MS;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The replica of SyncGuard's PostgreSQL backend acquire: one transaction,
// 8 round trips when granted, 5 when the key is held.
async function acquire(sql, key) {
  const lockId = randomBytes(16).toString("base64url");
  const fenceKey = "fence:" + key;
  return sql.begin(async (tx) => {
    await tx`SELECT pg_advisory_xact_lock(hashtext(${key}))`;
    const [t] = await tx`SELECT EXTRACT(EPOCH FROM NOW()) * 1000 AS now_ms`;
    const nowMs = Math.floor(Number(t.now_ms));
    const rows = await tx`SELECT * FROM ${tx("syncguard_locks")} WHERE key = ${key}`;
    if (rows.length > 0 && isLive(Number(rows[0].expires_at_ms), nowMs)) {
      return { ok: false };
    }
    await tx`INSERT INTO ${tx("syncguard_fence_counters")} (fence_key, fence, key_debug) VALUES (${fenceKey}, 0, ${key}) ON CONFLICT (fence_key) DO NOTHING`;
    const [f] = await tx`UPDATE ${tx("syncguard_fence_counters")} SET fence = fence + 1 WHERE fence_key = ${fenceKey} RETURNING fence`;
    const fence = String(BigInt(f.fence)).padStart(15, "0");
    await tx`INSERT INTO ${tx("syncguard_locks")} (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key)
      VALUES (${key}, ${lockId}, ${nowMs + TTL_MS}, ${nowMs}, ${fence}, ${key})
      ON CONFLICT (key) DO UPDATE SET lock_id = EXCLUDED.lock_id, expires_at_ms = EXCLUDED.expires_at_ms,
      acquired_at_ms = EXCLUDED.acquired_at_ms, fence = EXCLUDED.fence, user_key = EXCLUDED.user_key`;
    return { ok: true, lockId };
  });
}

// The replica's release: 5 round trips.
async function release(sql, lockId) {
  return sql.begin(async (tx) => {
    const [t] = await tx`SELECT EXTRACT(EPOCH FROM NOW()) * 1000 AS now_ms`;
    const nowMs = Math.floor(Number(t.now_ms));
    const rows = await tx`SELECT * FROM ${tx("syncguard_locks")} WHERE lock_id = ${lockId} FOR UPDATE`;
    if (rows.length === 0 || rows[0].lock_id !== lockId || !isLive(Number(rows[0].expires_at_ms), nowMs)) {
      return { ok: false };
    }
    await tx`DELETE FROM ${tx("syncguard_locks")} WHERE key = ${rows[0].key}`;
    return { ok: true };
  });
}

// The replica of lock(backend, fn, config) with default acquisition
// options: attempt, then sleep base·2^(n−1) with equal jitter (uniform in
// [d/2, d]) clamped to the time left, until the 5 s timeout; release in
// finally, errors swallowed. stats.attempts counts backend attempts.
async function lockReplica(sql, key, fn, stats) {
  key = key.normalize("NFC");
  const start = Date.now();
  let attempts = 0;
  let lockId;
  for (;;) {
    attempts++;
    const elapsed = Date.now() - start;
    if (elapsed >= ACQ.timeoutMs) {
      throw new LockError("AcquisitionTimeout", `Failed to acquire lock after ${elapsed}ms (${attempts} attempts)`);
    }
    stats.attempts++;
    const r = await acquire(sql, key);
    if (r.ok) {
      lockId = r.lockId;
      break;
    }
    if (attempts > ACQ.maxRetries) {
      throw new LockError("AcquisitionTimeout", `Failed to acquire lock after ${attempts} attempts (lock contention)`);
    }
    let d = ACQ.retryDelayMs * Math.pow(2, attempts - 1);
    d = d / 2 + Math.random() * (d / 2);
    d = Math.min(d, Math.max(0, ACQ.timeoutMs - (Date.now() - start)));
    if (d <= 0) {
      throw new LockError("AcquisitionTimeout", "Timeout reached before next retry");
    }
    await sleep(d);
  }
  try {
    return await fn();
  } finally {
    try {
      await release(sql, lockId);
    } catch {
      // SyncGuard swallows release errors (the lease expires by itself).
    }
  }
}

async function loadLock(sql) {
  try {
    const sg = await import("syncguard/postgres");
    const lk = sg.createLock(sql);
    return { impl: "syncguard", lock: (key, fn) => lk(fn, { key }) };
  } catch {
    return { impl: "syncguard-replica", lock: null };
  }
}

function pct(sorted, p) {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor(p * (sorted.length - 1)))];
}

async function main() {
  const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  const first = await lines.next();
  const spec = JSON.parse(first.value);
  const sql = postgres({
    host: spec.host,
    port: spec.port,
    user: spec.user,
    password: spec.password || undefined,
    database: spec.database,
    ssl: spec.ssl || false,
    max: 10, // postgres.js's default pool size
    connection: { search_path: spec.schema, application_name: spec.app },
    onnotice: () => {},
  });
  const { impl, lock: real } = await loadLock(sql);
  const stats = { attempts: 0 };
  const lock = real ?? ((key, fn) => lockReplica(sql, key, fn, stats));
  // Warm up: open connections, prepare the statements.
  await Promise.all(spec.keys.map((k) => lock(k, async () => {})));
  stats.attempts = 0;
  process.stdout.write(JSON.stringify({ ready: true, impl }) + "\n");
  const go = await lines.next();
  if (go.done || go.value.trim() !== "go") {
    throw new Error("no go signal");
  }
  const rep = { impl, sections: 0, timeouts: 0, errors: 0, error: "", waits_ms: [] };
  const perKey = new Array(spec.keys.length).fill(0);
  const waits = [];
  const t0 = Date.now();
  const end = t0 + spec.durationMs;
  const loop = async () => {
    while (Date.now() < end) {
      const i = Math.floor(Math.random() * spec.keys.length);
      const s = Date.now();
      try {
        await lock(spec.keys[i], async () => {});
        waits.push(Date.now() - s);
        rep.sections++;
        perKey[i]++;
      } catch (e) {
        if (e && e.code === "AcquisitionTimeout") {
          rep.timeouts++;
        } else {
          rep.errors++;
          if (!rep.error) rep.error = String((e && e.code) || "") + " " + String((e && e.message) || e);
        }
      }
    }
  };
  await Promise.all(Array.from({ length: spec.loops }, loop));
  rep.seconds = (Date.now() - t0) / 1000;
  waits.sort((a, b) => a - b);
  rep.wait_p50_ms = pct(waits, 0.5);
  rep.wait_p99_ms = pct(waits, 0.99);
  rep.wait_max_ms = waits.length ? waits[waits.length - 1] : 0;
  rep.waits_ms = waits;
  rep.per_key = perKey;
  rep.attempts = real ? -1 : stats.attempts;
  process.stdout.write(JSON.stringify(rep) + "\n");
  await sql.end({ timeout: 5 });
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stdout.write(JSON.stringify({ err: String((e && e.message) || e) }) + "\n");
    process.exit(1);
  },
);

package driver

// setupSQL creates the soak's own tables in its database, after
// pglease's schema: the fenced resource (one row per lease key), the
// resource's write log, and audit logs of every change to the lock table
// (grants, extends, releases, takeovers) and to its shared-hold table
// (readers and permits: grants, extends, releases, cleanups), each
// written by a trigger in the same transaction as the change, so the logs
// hold exactly what committed. The two audit logs share one sequence:
// every grant of a key holds the key's transaction advisory lock until it
// commits, so per key the sequence is the grants' commit order across
// both tables. Each row has its transaction's id (sets: one transaction
// grants the whole set). The audits store an md5 of the lockId (lock
// table) or its pg.GrantID (shared holds, as the workers log it), never
// the lockId itself.
const setupSQL = `
CREATE SEQUENCE soak_audit_seq;
CREATE TABLE soak_res (
  key int PRIMARY KEY,
  fence bigint,
  counter bigint NOT NULL DEFAULT 0,
  op bigint
);
CREATE TABLE soak_res_log (
  seq bigint PRIMARY KEY DEFAULT nextval('soak_audit_seq'),
  key int NOT NULL,
  old_fence bigint, new_fence bigint,
  old_counter bigint NOT NULL, new_counter bigint NOT NULL,
  op bigint,
  at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION soak_res_audit() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO soak_res_log (key, old_fence, new_fence, old_counter, new_counter, op)
    VALUES (NEW.key, OLD.fence, NEW.fence, OLD.counter, NEW.counter, NEW.op);
  RETURN NULL;
END $fn$;
CREATE TRIGGER soak_res_audit AFTER UPDATE ON soak_res FOR EACH ROW EXECUTE FUNCTION soak_res_audit();

CREATE TABLE soak_lock_log (
  seq bigint PRIMARY KEY DEFAULT nextval('soak_audit_seq'),
  tg text NOT NULL,            -- I grant, U extend or takeover, D release/cleanup
  user_key text NOT NULL,
  id_hash text NOT NULL,       -- md5(lock_id)
  old_id_hash text,
  fence bigint NOT NULL,
  old_fence bigint,
  acquired_ms bigint NOT NULL,
  expires_ms bigint NOT NULL,
  old_expires_ms bigint,
  at timestamptz NOT NULL DEFAULT clock_timestamp(),
  xid bigint NOT NULL DEFAULT txid_current(),
  app text NOT NULL DEFAULT current_setting('application_name')
);
CREATE FUNCTION soak_lock_audit() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO soak_lock_log (tg, user_key, id_hash, fence, acquired_ms, expires_ms)
      VALUES ('D', OLD.user_key, md5(OLD.lock_id), OLD.fence::bigint, OLD.acquired_at_ms, OLD.expires_at_ms);
  ELSIF TG_OP = 'INSERT' THEN
    INSERT INTO soak_lock_log (tg, user_key, id_hash, fence, acquired_ms, expires_ms)
      VALUES ('I', NEW.user_key, md5(NEW.lock_id), NEW.fence::bigint, NEW.acquired_at_ms, NEW.expires_at_ms);
  ELSE
    INSERT INTO soak_lock_log (tg, user_key, id_hash, old_id_hash, fence, old_fence, acquired_ms, expires_ms, old_expires_ms)
      VALUES ('U', NEW.user_key, md5(NEW.lock_id), md5(OLD.lock_id), NEW.fence::bigint, OLD.fence::bigint,
              NEW.acquired_at_ms, NEW.expires_at_ms, OLD.expires_at_ms);
  END IF;
  RETURN NULL;
END $fn$;
CREATE TRIGGER soak_lock_audit AFTER INSERT OR UPDATE OR DELETE ON syncguard_locks
  FOR EACH ROW EXECUTE FUNCTION soak_lock_audit();

CREATE TABLE soak_shared_log (
  seq bigint PRIMARY KEY DEFAULT nextval('soak_audit_seq'),
  tg text NOT NULL,            -- I grant, U extend, D release/cleanup
  user_key text NOT NULL,
  grant_id text NOT NULL,      -- pg.GrantID(lock_id)
  lim integer NOT NULL,        -- 0 reader, n permit of n
  fence bigint NOT NULL,
  acquired_ms bigint NOT NULL,
  expires_ms bigint NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp(),
  xid bigint NOT NULL DEFAULT txid_current(),
  app text NOT NULL DEFAULT current_setting('application_name')
);
CREATE FUNCTION soak_grant_id(lock_id text) RETURNS text LANGUAGE sql IMMUTABLE AS $fn$
  SELECT encode(sha256(convert_to('pglease grant v1', 'UTF8') || '\x00'::bytea || convert_to(lock_id, 'UTF8')), 'hex')
$fn$;
CREATE FUNCTION soak_shared_audit() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO soak_shared_log (tg, user_key, grant_id, lim, fence, acquired_ms, expires_ms)
      VALUES ('D', OLD.key, soak_grant_id(OLD.lock_id), OLD.lim, OLD.fence, OLD.acquired_at_ms, OLD.expires_at_ms);
  ELSE
    INSERT INTO soak_shared_log (tg, user_key, grant_id, lim, fence, acquired_ms, expires_ms)
      VALUES (left(TG_OP, 1), NEW.key, soak_grant_id(NEW.lock_id), NEW.lim, NEW.fence, NEW.acquired_at_ms, NEW.expires_at_ms);
  END IF;
  RETURN NULL;
END $fn$;
CREATE TRIGGER soak_shared_audit AFTER INSERT OR UPDATE OR DELETE ON syncguard_locks_shared
  FOR EACH ROW EXECUTE FUNCTION soak_shared_audit();

-- The fair queue's tickets (-fair runs): enqueue, refresh, delete (a
-- grant, a leave, an expired ticket dropped), in the lock audits' sequence:
-- every statement that grants or enqueues holds its key's advisory lock.
-- A ticket's lockId is its grant's, so each row names it both ways: as the
-- lock log (md5) and as the shared log (soak_grant_id).
CREATE TABLE soak_queue_log (
  seq bigint PRIMARY KEY DEFAULT nextval('soak_audit_seq'),
  tg text NOT NULL,            -- I enqueue, U refresh, D delete
  user_key text NOT NULL,
  id_hash text NOT NULL,       -- md5(lock_id), as the lock log has it
  grant_id text NOT NULL,      -- soak_grant_id(lock_id), as the shared log has it
  tseq bigint NOT NULL,        -- the ticket's place (the queue's own seq)
  lim integer,
  set_no bigint,
  expires_ms bigint NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp(),
  xid bigint NOT NULL DEFAULT txid_current()
);
CREATE FUNCTION soak_queue_audit() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO soak_queue_log (tg, user_key, id_hash, grant_id, tseq, lim, set_no, expires_ms)
      VALUES ('D', OLD.key, md5(OLD.lock_id), soak_grant_id(OLD.lock_id), OLD.seq, OLD.lim, OLD.set_no, OLD.expires_at_ms);
  ELSE
    INSERT INTO soak_queue_log (tg, user_key, id_hash, grant_id, tseq, lim, set_no, expires_ms)
      VALUES (left(TG_OP, 1), NEW.key, md5(NEW.lock_id), soak_grant_id(NEW.lock_id), NEW.seq, NEW.lim, NEW.set_no, NEW.expires_at_ms);
  END IF;
  RETURN NULL;
END $fn$;
CREATE TRIGGER soak_queue_audit AFTER INSERT OR UPDATE OR DELETE ON syncguard_locks_queue
  FOR EACH ROW EXECUTE FUNCTION soak_queue_audit();
`

// brokenSQL is the server-side damage of the driver's broken modes that
// break the primitives, installed after setupSQL.
var brokenSQL = map[string]string{
	BrokenPartialSet:   partialSetSQL,
	BrokenExtraPermit:  extraPermitSQL,
	BrokenReaderWriter: readerWithWriterSQL,
}

// extraPermitSQL: next to every permit granted, in its transaction, a
// permit of the same limit that nobody holds (it lives until its expiry):
// two permits granted close together make the server's live permits
// exceed the limit.
const extraPermitSQL = `
CREATE FUNCTION soak_extra_permit() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF NEW.lim > 0 AND NEW.lock_id NOT LIKE 'soakextra-%' THEN
    INSERT INTO syncguard_locks_shared (lock_id, key, lim, expires_at_ms, acquired_at_ms, fence, holder)
      VALUES ('soakextra-' || md5(random()::text), NEW.key, NEW.lim, NEW.expires_at_ms, NEW.acquired_at_ms, NEW.fence, 'soak-extra');
  END IF;
  RETURN NULL;
END $fn$;
CREATE TRIGGER soak_extra_permit AFTER INSERT ON syncguard_locks_shared
  FOR EACH ROW EXECUTE FUNCTION soak_extra_permit();
`

// readerWithWriterSQL: next to every exclusive grant of a reader-writer
// key, in its transaction, a reader that nobody holds (it lives until the
// writer's expiry).
const readerWithWriterSQL = `
CREATE FUNCTION soak_reader_with_writer() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF NEW.user_key LIKE 'soak:rw:%' THEN
    INSERT INTO syncguard_locks_shared (lock_id, key, lim, expires_at_ms, acquired_at_ms, fence, holder)
      VALUES ('soakextra-' || md5(random()::text), NEW.key, 0, NEW.expires_at_ms, NEW.acquired_at_ms, NEW.fence::bigint, 'soak-extra');
  END IF;
  RETURN NULL;
END $fn$;
CREATE TRIGGER soak_reader_with_writer AFTER INSERT OR UPDATE OF lock_id ON syncguard_locks
  FOR EACH ROW EXECUTE FUNCTION soak_reader_with_writer();
`

// partialSetSQL is the partial-set control's damage: a trigger that, in
// the transaction granting a set, deletes the row of one of its keys now
// and then (the server commits part of a set; the holder is told it has
// all of them).
const partialSetSQL = `
CREATE FUNCTION soak_partial_set() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF NEW.user_key LIKE 'soak:set:%' AND random() < 0.3 THEN
    DELETE FROM syncguard_locks WHERE key = NEW.key AND lock_id = NEW.lock_id;
  END IF;
  RETURN NULL;
END $fn$;
CREATE TRIGGER soak_partial_set AFTER INSERT ON syncguard_locks
  FOR EACH ROW EXECUTE FUNCTION soak_partial_set();
`

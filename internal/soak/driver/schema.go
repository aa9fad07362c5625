package driver

// setupSQL creates the soak's own tables in its database, after
// pglease's schema: the fenced resource (one row per lease key), the
// resource's write log, and an audit log of every change to the lock
// table (grants, extends, releases, takeovers), each written by a trigger
// in the same transaction as the change, so the logs hold exactly what
// committed, in commit order per key. The audit stores an md5 of the
// lockId, never the lockId itself.
const setupSQL = `
CREATE TABLE soak_res (
  key int PRIMARY KEY,
  fence bigint,
  counter bigint NOT NULL DEFAULT 0,
  op bigint
);
CREATE TABLE soak_res_log (
  seq bigserial PRIMARY KEY,
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
  seq bigserial PRIMARY KEY,
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
`

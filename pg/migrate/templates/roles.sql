-- pglease least-privilege roles.
--
-- Two roles, both created beforehand by an administrator (this file does not
-- create roles or set passwords), e.g.:
--   CREATE ROLE pglease_owner LOGIN PASSWORD '...';
--   CREATE ROLE pglease_app   LOGIN PASSWORD '...';
--
--   owner role:   owns the tables and functions; runs SetupSchema
--                 (migrate.Migrator.Up) or applies schema.sql or the
--                 numbered migrations.
--   runtime role: what the application connects as. CONNECT, USAGE on the
--                 schema, SELECT/INSERT/UPDATE/DELETE on the lock table,
--                 SELECT/INSERT/UPDATE on pglease's holder table
--                 (syncguard_locks_holders), SELECT/INSERT/UPDATE/DELETE
--                 on its shared-hold table (syncguard_locks_shared),
--                 its queue table (syncguard_locks_queue),
--                 SELECT/INSERT/UPDATE on the fence table (never DELETE or
--                 TRUNCATE: fence counters are never deleted), EXECUTE on
--                 the pglease_* functions and on the SQL API's
--                 syncguard_locks_acquire/release/extend/status/revoke,
--                 SELECT on the views syncguard_locks_leases,
--                 syncguard_locks_waiters and pglease_advisory_locks. Not
--                 EXECUTE on syncguard_locks_guard/unguard (installing a
--                 database guard is the guarded table's owner's). Not
--                 superuser, no pg_signal_backend: pglease never needs
--                 either.
--   A SyncGuard service on the same tables may keep a role of its own with
--   only SyncGuard's grants (SELECT/INSERT/UPDATE/DELETE on the lock table,
--   SELECT/INSERT/UPDATE on the fence table): the release trigger
--   (SetupReleaseTrigger, run as the owner role) runs as its owner, so that
--   role's releases notify without EXECUTE on any pglease_* function.
--
-- psql variables (all required):
--   owner_role, runtime_role  the two role names
--   schema                    the schema holding the tables (e.g. public)
--   DBNAME                    set by psql itself: the database connected to
-- The table names are SyncGuard's defaults (syncguard_locks,
-- syncguard_fence_counters, and pglease's syncguard_locks_holders); edit
-- step 2 for other names. Functions are
-- found by name (pglease_* in the schema), so they need no editing.
--
-- Two steps, run as an administrator (superuser, or CREATEROLE plus
-- ownership of the schema and database):
--   1. Before the first SetupSchema: everything up to the "@@ step 2" line.
--        sed '/^-- @@ step 2/q' pg/migrate/sql/roles.sql | psql -v ON_ERROR_STOP=1 \
--          -v owner_role=pglease_owner -v runtime_role=pglease_app -v schema=public
--   2. After the owner ran SetupSchema (it refuses to run before): the whole
--      file (step 1 is idempotent).
--        psql -v ON_ERROR_STOP=1 -v owner_role=pglease_owner \
--          -v runtime_role=pglease_app -v schema=public -f pg/migrate/sql/roles.sql
-- Go code can use migrate.RolesSQL, which substitutes the variables (quoted).
-- Both steps are idempotent. Re-run step 2 after a change that creates new
-- tables or functions (a new schema version); CREATE OR REPLACE keeps the
-- grants of existing functions.

-- @@ step 1: owner role
ALTER ROLE :"owner_role" NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
GRANT CONNECT ON DATABASE :"DBNAME" TO :"owner_role";
GRANT USAGE, CREATE ON SCHEMA :"schema" TO :"owner_role";
-- Functions the owner creates from now on: not executable by PUBLIC (this
-- default is per role, not per schema), executable by the runtime role in
-- this schema.
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA :"schema" GRANT EXECUTE ON FUNCTIONS TO :"runtime_role";

-- @@ step 2: runtime role (after SetupSchema)
ALTER ROLE :"runtime_role" NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
GRANT CONNECT ON DATABASE :"DBNAME" TO :"runtime_role";
GRANT USAGE ON SCHEMA :"schema" TO :"runtime_role";
REVOKE ALL ON TABLE :"schema".syncguard_locks, :"schema".syncguard_fence_counters FROM PUBLIC, :"runtime_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE :"schema".syncguard_locks TO :"runtime_role";
-- No DELETE, no TRUNCATE: the privilege system enforces "fence counters are
-- never deleted" for the runtime role.
GRANT SELECT, INSERT, UPDATE ON TABLE :"schema".syncguard_fence_counters TO :"runtime_role";
-- pglease's holder identity table (schema version 2): upserted by acquire
-- (one row per key, never deleted). SyncGuard never uses it.
REVOKE ALL ON TABLE :"schema".syncguard_locks_holders FROM PUBLIC, :"runtime_role";
GRANT SELECT, INSERT, UPDATE ON TABLE :"schema".syncguard_locks_holders TO :"runtime_role";
-- pglease's shared-hold table (schema version 4): rows inserted by shared
-- acquires, deleted by their release or after their expiry.
REVOKE ALL ON TABLE :"schema".syncguard_locks_shared FROM PUBLIC, :"runtime_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE :"schema".syncguard_locks_shared TO :"runtime_role";
-- pglease's queue table (schema version 4): one ticket per waiting caller,
-- inserted and refreshed by its waiter, deleted by a grant, a leave or
-- after its expiry.
REVOKE ALL ON TABLE :"schema".syncguard_locks_queue FROM PUBLIC, :"runtime_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE :"schema".syncguard_locks_queue TO :"runtime_role";
-- The SQL API (schema version 4): the functions SQL callers use, and the
-- views (which show no lockId: a monitoring role may be given SELECT on
-- them alone).
REVOKE ALL ON FUNCTION :"schema".syncguard_locks_acquire(text, bigint), :"schema".syncguard_locks_release(text),
  :"schema".syncguard_locks_extend(text, bigint), :"schema".syncguard_locks_status(text),
  :"schema".syncguard_locks_revoke(text, bigint, text), :"schema".syncguard_locks_request_release(text, text),
  :"schema".syncguard_locks_guard(regclass, name), :"schema".syncguard_locks_guard(regclass, name, boolean),
  :"schema".syncguard_locks_unguard(regclass) FROM PUBLIC, :"runtime_role";
GRANT EXECUTE ON FUNCTION :"schema".syncguard_locks_acquire(text, bigint), :"schema".syncguard_locks_release(text),
  :"schema".syncguard_locks_extend(text, bigint), :"schema".syncguard_locks_status(text),
  :"schema".syncguard_locks_revoke(text, bigint, text), :"schema".syncguard_locks_request_release(text, text) TO :"runtime_role";
REVOKE ALL ON TABLE :"schema".syncguard_locks_leases, :"schema".syncguard_locks_waiters, :"schema".pglease_advisory_locks
  FROM PUBLIC, :"runtime_role";
GRANT SELECT ON TABLE :"schema".syncguard_locks_leases, :"schema".syncguard_locks_waiters, :"schema".pglease_advisory_locks
  TO :"runtime_role";
-- EXECUTE on every pglease_* function in the schema, for the runtime role
-- only (also for functions created before step 1).
SET pglease.roles_schema = :'schema';
SET pglease.roles_runtime = :'runtime_role';
DO $pglease$
DECLARE
  f regprocedure;
  n integer := 0;
BEGIN
  FOR f IN
    SELECT p.oid::regprocedure FROM pg_proc AS p JOIN pg_namespace AS s ON s.oid = p.pronamespace
    WHERE s.nspname = current_setting('pglease.roles_schema') AND p.proname LIKE 'pglease\_%'
  LOOP
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, current_setting('pglease.roles_runtime'));
    n := n + 1;
  END LOOP;
  IF n = 0 THEN
    RAISE EXCEPTION 'pglease: no pglease_* functions in schema %; run SetupSchema (as the owner role) first',
      current_setting('pglease.roles_schema');
  END IF;
END
$pglease$;
RESET pglease.roles_schema;
RESET pglease.roles_runtime;

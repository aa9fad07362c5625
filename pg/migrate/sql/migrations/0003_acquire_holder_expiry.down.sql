-- pglease migration 3 (acquire_holder_expiry), down: see package github.com/pglease/pglease/pg/migrate.
SELECT pg_advisory_xact_lock(hashtext('pglease.SetupSchema'));
DROP FUNCTION IF EXISTS "pglease_acquire_8eefe2f09a"(text[], text[], text[], text[], bigint[], text);
-- The schema version record: SELECT * FROM "pglease_schema_858d8d6934"();
CREATE OR REPLACE FUNCTION "pglease_schema_858d8d6934"(OUT version integer, OUT compatible_from integer)
LANGUAGE sql IMMUTABLE AS $fn$ SELECT 2, 2 $fn$;

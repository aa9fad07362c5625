-- The schema version record: SELECT * FROM {fn_schema}();
CREATE OR REPLACE FUNCTION {fn_schema}(OUT version integer, OUT compatible_from integer)
LANGUAGE sql IMMUTABLE AS $fn$ SELECT {version}, {compatible_from} $fn$;

DROP FUNCTION IF EXISTS {fn_acquire_v2}(text[], text[], text[], text[], bigint[], text);
DROP FUNCTION IF EXISTS {fn_release}(text[], text);
DROP FUNCTION IF EXISTS {fn_extend}(text[], bigint[]);
DROP FUNCTION IF EXISTS {fn_handoff}(text[], text[], text[], text[], text[], bigint[], text, text);
DROP TABLE IF EXISTS {h};

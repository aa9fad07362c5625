DROP FUNCTION IF EXISTS {fn_acquire}(text[], text[], text[], text[], bigint[], text);

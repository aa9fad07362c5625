-- Keep SyncGuard's tables and fence counters unless asked explicitly:
-- SET pglease.drop_tables = 'on' (or options=-c pglease.drop_tables=on in the connection string).
DO $pglease$
BEGIN
  IF coalesce(current_setting('pglease.drop_tables', true), '') = 'on' THEN
    DROP TABLE IF EXISTS {t};
    DROP TABLE IF EXISTS {f};
  ELSE
    RAISE NOTICE 'pglease: kept the lock and fence counter tables (set pglease.drop_tables = on to drop them)';
  END IF;
END
$pglease$;

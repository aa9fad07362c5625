-- The design's rollback (plus generate_lock_id). Advisory locks are not
-- dropped: they end with their sessions.
DROP FUNCTION IF EXISTS acquire_cleanup_lock(text);
DROP FUNCTION IF EXISTS release_cleanup_lock(text);
DROP FUNCTION IF EXISTS generate_lock_id(text, text);
DROP FUNCTION IF EXISTS email_to_lock_id(text);

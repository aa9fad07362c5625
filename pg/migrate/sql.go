package migrate

import (
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
)

// SQL returns the lease schema's SQL for cfg's table names as files, for
// teams that apply migrations with their own tools or by hand (Up applies
// the same SQL):
//
//	schema.sql               every migration's up SQL in order, one file (psql -f)
//	migrations/              the numbered migrations in golang-migrate's layout,
//	                         which Atlas also reads (format=golang-migrate):
//	                         0001_syncguard_tables.up.sql, ….down.sql, …
//	goose/                   the same for goose (one file each, -- +goose Up / Down)
//	designs/migrations/      the optional design functions (email_to_lock_id,
//	designs/goose/           generate_lock_id, acquire_cleanup_lock,
//	                         release_cleanup_lock: the email-keyed cleanup lock
//	                         design, equal to pg/advisory's SHA256Key and
//	                         NamespacedKey), a sequence of their own: give them
//	                         their own migrations table
//	roles.sql                the least-privilege grants as a psql script (see
//	                         RolesSQL)
//	release_trigger.sql      with cfg.NotifyChannel set: SetupReleaseTrigger's
//	release_trigger_drop.sql DDL for that channel, and DropReleaseTrigger's
//
// The files for the default names are also in the source tree, in
// pg/migrate/sql (a test keeps them equal to SQL(pg.Config{})), and
// `pglease sql` prints them for any names. From Go, give the returned
// file system to the tools: golang-migrate's iofs.New(fsys, "migrations"),
// goose.NewProvider(goose.DialectPostgres, db, sub) with sub the "goose"
// directory of fsys (fs.Sub).
//
//	migrate -path pg/migrate/sql/migrations -database "$DATABASE_URL" up
//	migrate -path pg/migrate/sql/designs/migrations -database "$DATABASE_URL&x-migrations-table=pglease_design_migrations" up
//	goose -dir pg/migrate/sql/goose postgres "$DATABASE_URL" up
//	goose -dir pg/migrate/sql/designs/goose -table pglease_design_migrations postgres "$DATABASE_URL" up
//	atlas migrate hash --dir "file://pg/migrate/sql/migrations?format=golang-migrate"   # once: Atlas wants atlas.sum
//	atlas migrate apply --dir "file://pg/migrate/sql/migrations?format=golang-migrate" --url "$DATABASE_URL"
//
// Each migration is one transaction (golang-migrate sends a file as one
// statement; goose wraps a migration in one), takes the advisory lock Up
// takes (so a tool and starting processes serialize), and records the
// version it leaves in the function pglease_schema_<hash>() (SELECT * FROM
// it), which pglease checks before its first acquire: migrate before
// deploying a pglease that needs a newer version. Down never drops
// SyncGuard's tables, and so never loses a fence counter, unless the
// session sets pglease.drop_tables = 'on' (e.g.
// options=-c%20pglease.drop_tables%3Don in the connection URL, or
// PGOPTIONS="-c pglease.drop_tables=on" for psql). Bad names are
// InvalidArgument.
func SQL(cfg pg.Config) (fs.FS, error) {
	n, err := store.Config(cfg).Names("migrate.SQL")
	if err != nil {
		return nil, err
	}
	files := map[string]string{"roles.sql": tmpl("roles.sql")}
	add := func(dir string, ms []migration) {
		for _, m := range ms {
			files[path.Join(dir, "migrations", m.file()+".up.sql")] = m.up
			files[path.Join(dir, "migrations", m.file()+".down.sql")] = m.down
			files[path.Join(dir, "goose", m.file()+".sql")] = "-- +goose Up\n-- +goose StatementBegin\n" + m.up +
				"-- +goose StatementEnd\n\n-- +goose Down\n-- +goose StatementBegin\n" + m.down + "-- +goose StatementEnd\n"
		}
	}
	ms := migrations(n)
	add("", ms)
	add("designs", designs())
	var schema strings.Builder
	for _, mg := range ms {
		schema.WriteString(mg.up)
	}
	files["schema.sql"] = schema.String()
	if cfg.NotifyChannel != "" {
		files["release_trigger.sql"] = setupLock + triggerSQL(n, cfg.NotifyChannel)
		files["release_trigger_drop.sql"] = setupLock + dropTriggerSQL(n)
	}
	return memFS(files), nil
}

// memFS is a read-only file system of the files it maps (slash-separated
// paths); directories are implied by the paths.
type memFS map[string]string

func (m memFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if s, ok := m[name]; ok {
		return &memFile{info: memInfo{name: path.Base(name), size: int64(len(s))}, r: strings.NewReader(s)}, nil
	}
	prefix := name + "/"
	if name == "." {
		prefix = ""
	}
	seen := map[string]bool{}
	var entries []fs.DirEntry
	for p, s := range m {
		rest, ok := strings.CutPrefix(p, prefix)
		if !ok {
			continue
		}
		child, _, isDir := strings.Cut(rest, "/")
		if seen[child] {
			continue
		}
		seen[child] = true
		if isDir {
			entries = append(entries, memInfo{name: child, dir: true})
		} else {
			entries = append(entries, memInfo{name: child, size: int64(len(s))})
		}
	}
	if len(entries) == 0 {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return &memDir{info: memInfo{name: path.Base(name), dir: true}, entries: entries}, nil
}

// memInfo is both the fs.FileInfo and the fs.DirEntry of a file or
// directory.
type memInfo struct {
	name string
	size int64
	dir  bool
}

func (i memInfo) Name() string { return i.name }
func (i memInfo) Size() int64  { return i.size }
func (i memInfo) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o555
	}
	return 0o444
}
func (i memInfo) ModTime() time.Time                  { return time.Time{} }
func (i memInfo) IsDir() bool                         { return i.dir }
func (i memInfo) Sys() any                            { return nil }
func (i memInfo) Type() fs.FileMode                   { return i.Mode().Type() }
func (i memInfo) Info() (fs.FileInfo, error)          { return i, nil }
func (f *memFile) Stat() (fs.FileInfo, error)         { return f.info, nil }
func (f *memFile) Read(b []byte) (int, error)         { return f.r.Read(b) }
func (f *memFile) Seek(o int64, w int) (int64, error) { return f.r.Seek(o, w) }
func (f *memFile) Close() error                       { return nil }
func (d *memDir) Stat() (fs.FileInfo, error)          { return d.info, nil }
func (d *memDir) Close() error                        { return nil }

func (d *memDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.info.name, Err: fs.ErrInvalid}
}

type memFile struct {
	info memInfo
	r    *strings.Reader
}

type memDir struct {
	info    memInfo
	entries []fs.DirEntry
	next    int
}

// ReadDir follows fs.ReadDirFile: n > 0 reads at most n entries (io.EOF
// at the end), n <= 0 all the remaining ones.
func (d *memDir) ReadDir(n int) ([]fs.DirEntry, error) {
	rest := d.entries[d.next:]
	if n <= 0 {
		d.next = len(d.entries)
		return slices.Clone(rest), nil
	}
	if len(rest) == 0 {
		return nil, io.EOF
	}
	n = min(n, len(rest))
	d.next += n
	return slices.Clone(rest[:n]), nil
}

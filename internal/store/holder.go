package store

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

var defaultHolder = sync.OnceValue(func() string {
	prog := "unknown"
	if exe, err := os.Executable(); err == nil {
		prog = filepath.Base(exe)
	} else if len(os.Args) > 0 {
		prog = filepath.Base(os.Args[0])
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	h := prog + "[" + strconv.Itoa(os.Getpid()) + "]@" + host
	if checkHolder("", h) != nil || len(h) > MaxHolderBytes {
		return "pid " + strconv.Itoa(os.Getpid())
	}
	return h
})

// DefaultHolder is the holder identity a Store records when
// Config.Holder is empty: "program[pid]@host", e.g. "worker[4242]@web-1"
// (the executable's base name, the process id and the host name).
func DefaultHolder() string { return defaultHolder() }

// checkHolder validates a holder identity: 1..MaxHolderBytes bytes of
// UTF-8 without control characters (it is shown on terminals).
func checkHolder(op, h string) error {
	if h == "" || len(h) > MaxHolderBytes || !utf8.ValidString(h) {
		return pgerr.New(pglease.CodeInvalidArgument, op, "Holder must be 1-256 bytes of UTF-8", nil)
	}
	for _, r := range h {
		if unicode.IsControl(r) {
			return pgerr.New(pglease.CodeInvalidArgument, op, "Holder contains a control character", nil)
		}
	}
	return nil
}

// Holder returns the holder identity the Store records (Config.Holder or
// DefaultHolder()).
func (s *Store) Holder() string { return s.holder }

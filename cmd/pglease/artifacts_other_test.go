//go:build !go1.26

package main

import "testing"

// testArtifactDir is a directory for the test's output files (Go before
// 1.26 has no testing.T.ArtifactDir): set PGLEASE_ARTIFACTS_DIR to keep
// them.
func testArtifactDir(t *testing.T) string { return t.TempDir() }

//go:build go1.26

package main

import "testing"

// testArtifactDir is the test's artifacts directory (go test -artifacts
// -outputdir DIR keeps it; otherwise it is removed after the test).
func testArtifactDir(t *testing.T) string { return t.ArtifactDir() }

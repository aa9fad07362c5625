package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// runPeers builds the peers module (cfg.peersDir: cirello pglock and bsm
// redislock, a module of its own so the library's go.mod gains no
// dependency) and runs it on the same PostgreSQL with the same callers and
// duration; its results are printed and plotted with pglease's. redislock
// runs only when redis-server is installed; the peers program says so when
// it is not.
func runPeers(ctx context.Context, cfg config, emit func(Result), note noteFunc) error {
	if _, err := os.Stat(filepath.Join(cfg.peersDir, "go.mod")); err != nil {
		note("peers: skipped, no peers module at %s (run from the repository root, or set -peers-dir)", cfg.peersDir)
		return nil
	}
	tmp, err := os.MkdirTemp("", "pglease-peers")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "peers")
	build := exec.CommandContext(ctx, goTool(), "build", "-o", bin, ".")
	build.Dir = cfg.peersDir
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w\n%s", cfg.peersDir, err, out)
	}
	args := []string{"-duration", cfg.duration.String(), "-callers", joinInts(cfg.callers), "-hot-callers", joinInts(cfg.hotCallers)}
	var scen []string
	for _, s := range []string{"uncontended", "hotkey"} {
		if cfg.scenarios[s] {
			scen = append(scen, s)
		}
	}
	if len(scen) == 0 {
		return nil
	}
	args = append(args, "-scenarios", strings.Join(scen, ","))
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+cfg.url)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Result
			Note string `json:"note"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return fmt.Errorf("peers printed %q: %w", sc.Text(), err)
		}
		if line.Note != "" {
			note("%s", line.Note)
			continue
		}
		emit(line.Result)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("peers: %w", err)
	}
	return nil
}

// goTool is the go command that runs this bench (go run sets no GOROOT
// for the child, so prefer the toolchain's own binary when it is known).
func goTool() string {
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

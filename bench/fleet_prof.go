package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
)

// phaseProfiler writes a worker's CPU profile phase by phase: a profile
// runs from one command to the next, and is written as
// <dir>/w<worker>-<n>-<command that ended it>.pprof (so the measured
// window is the profile ended by the second "report", the idle fleet the
// one ended by the "report" after "idle"). A nil one does nothing.
type phaseProfiler struct {
	dir    string
	worker int
	n      int
	f      *os.File
}

func newPhaseProfiler(dir string, worker int) *phaseProfiler {
	if dir == "" {
		return nil
	}
	p := &phaseProfiler{dir: dir, worker: worker}
	p.start()
	return p
}

func (p *phaseProfiler) start() {
	f, err := os.Create(filepath.Join(p.dir, fmt.Sprintf("w%d-%d.tmp", p.worker, p.n)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench fleet worker: cpu profile:", err)
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintln(os.Stderr, "bench fleet worker: cpu profile:", err)
		_ = f.Close()
		return
	}
	p.f = f
}

// stop ends the running profile, naming it after cmd.
func (p *phaseProfiler) stop(cmd string) {
	if p == nil || p.f == nil {
		return
	}
	pprof.StopCPUProfile()
	name := p.f.Name()
	_ = p.f.Close()
	p.f = nil
	_ = os.Rename(name, filepath.Join(p.dir, fmt.Sprintf("w%d-%d-%s.pprof", p.worker, p.n, cmd)))
	p.n++
}

// next ends the running profile at cmd and starts the next one.
func (p *phaseProfiler) next(cmd string) {
	if p == nil {
		return
	}
	p.stop(cmd)
	p.start()
}

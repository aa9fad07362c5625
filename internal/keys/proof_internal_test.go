package keys

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"sync"
	"testing"
)

// The pooled HMAC states of proofOf answer what a fresh HMAC with the
// process's key answers, also when many goroutines take lockIds at once.
func TestProofOfPooledMatchesFresh(t *testing.T) {
	t.Parallel()
	proofInit()
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c [8]byte
			for i := 0; i < 2000; i++ {
				binary.BigEndian.PutUint64(c[:], uint64(g)<<32|uint64(i))
				m := hmac.New(sha256.New, proofKey[:])
				m.Write(c[:6])
				if want := m.Sum(nil); !bytes.Equal(proofOf(c[:6]), want) {
					errs <- "proofOf differs from a fresh HMAC"
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

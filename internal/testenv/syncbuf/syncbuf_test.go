package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// Writers and a reader at once: under -race this is the test; without, every line arrives.
func TestConcurrentWriters(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.WriteString("line\n")
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := strings.Count(b.String(), "line\n"); n != 400 {
		t.Fatalf("%d lines, want 400", n)
	}
}

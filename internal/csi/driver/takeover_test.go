package driver

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/go-logr/logr"

	"github.com/crdipc/crdipc/internal/storage/fdstore"
)

// The holder's names carry the loop device, which nothing else tells the next process; a
// name that is not one of ours, or names a path rather than a device, is left alone.
func TestParseHolderName(t *testing.T) {
	for _, tc := range []struct {
		name, id, loop string
		ok             bool
	}{
		{"csi-target/pvc-1/loop3", "pvc-1", "/dev/loop3", true},
		{"csi-target/pvc-1", "", "", false},
		{"csi-target//loop3", "", "", false},
		{"csi-target/pvc-1/sda", "", "", false},
		{"csi-target/pvc-1/loop3/x", "", "", false},
		{"other/pvc-1/loop3", "", "", false},
	} {
		id, loop, ok := parseHolderName(tc.name)
		if id != tc.id || loop != tc.loop || ok != tc.ok {
			t.Errorf("parseHolderName(%q) = %q, %q, %v; want %q, %q, %v", tc.name, id, loop, ok, tc.id, tc.loop, tc.ok)
		}
	}
}

// The holder's upkeep drops the entries no volume of this process is served by (a forget
// that failed, an entry put back while its volume was unstaged), but not those of a volume
// in a Node call or being taken over: they are what it is about to serve.
func TestDropStaleLeavesBusyVolumes(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "fd.sock")
	l, err := fdstore.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	store := fdstore.New(slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = store.Serve(ctx, l) }()
	d := &Driver{log: logr.Discard(), o: Options{FDHolder: sock, NodeID: "node-1"}}
	h := d.holder()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	const stale, busy, other = "csi-target/pvc-1/loop3", "csi-target/pvc-2/loop4", "someone-else"
	for _, n := range []string{stale, busy, other} {
		if err := h.Put(n, int(r.Fd())); err != nil {
			t.Fatal(err)
		}
	}
	done, err := d.lockVolume("pvc-2")
	if err != nil {
		t.Fatal(err)
	}
	names, err := h.List()
	if err != nil {
		t.Fatal(err)
	}
	d.dropStale(names)
	if got, want := store.Names(), []string{busy, other}; !slices.Equal(got, want) {
		t.Errorf("after dropping stale entries: %v, want %v", got, want)
	}
	done()
	d.dropStale(names)
	if got, want := store.Names(), []string{other}; !slices.Equal(got, want) {
		t.Errorf("once the volume is no longer busy: %v, want %v", got, want)
	}
}

package bench

import (
	"strings"
	"testing"

	"github.com/crdipc/crdipc/internal/storage/blockdev"
)

// TestVolumeUnavailable: a host without fio skips the volume bench with the reason, unless
// CRDIPC_REQUIRE_FIO=1, which makes it an error; the same for mounts and
// CRDIPC_REQUIRE_MOUNT=1.
func TestVolumeUnavailable(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	const noFio = "/nonexistent/fio"
	why, err := volumeUnavailable(noFio, env())
	if err != nil || !strings.Contains(why, "fio is missing") {
		t.Errorf("without fio: %q, %v; want a reason naming fio and no error", why, err)
	}
	if _, err := volumeUnavailable(noFio, env("CRDIPC_REQUIRE_FIO", "1")); err == nil || !strings.Contains(err.Error(), "CRDIPC_REQUIRE_FIO=1") {
		t.Errorf("without fio, CRDIPC_REQUIRE_FIO=1: %v, want an error naming it", err)
	}
	mounts := blockdev.Available()
	why, err = volumeUnavailable("true", env("CRDIPC_REQUIRE_MOUNT", "1"))
	switch {
	case mounts == nil && (err != nil || why != ""):
		t.Errorf("host can mount, fio present: %q, %v; want it to run", why, err)
	case mounts != nil && (err == nil || !strings.Contains(err.Error(), "CRDIPC_REQUIRE_MOUNT=1")):
		t.Errorf("host cannot mount (%v), CRDIPC_REQUIRE_MOUNT=1: %v, want an error naming it", mounts, err)
	}
	if mounts != nil {
		if why, err := volumeUnavailable("true", env()); err != nil || why != mounts.Error() {
			t.Errorf("host cannot mount: %q, %v; want the reason %q", why, err, mounts)
		}
	}
}

func TestParseSkip(t *testing.T) {
	skip, err := ParseSkip([]string{NameScale, NameVolume})
	if err != nil || len(skip) != 2 || !skip[NameScale] || !skip[NameVolume] {
		t.Errorf("scale,volume: %v, %v", skip, err)
	}
	if _, err := ParseSkip([]string{"flor"}); err == nil || !strings.Contains(err.Error(), "floor, roundtrip") {
		t.Errorf("a misspelt bench: %v, want an error listing the benches", err)
	}
}

// TestOrDefault: zero options become the defaults, options set stay as they are.
func TestOrDefault(t *testing.T) {
	var o AllOptions
	orDefault(&o.Floor, DefaultFloorOptions)
	if o.Floor.Creates != DefaultFloorOptions.Creates || len(o.Floor.Writers) != len(DefaultFloorOptions.Writers) {
		t.Errorf("zero floor options became %+v, want the defaults", o.Floor)
	}
	o.Scale = ScaleOptions{Sizes: []int{10}}
	orDefault(&o.Scale, DefaultScaleOptions)
	if len(o.Scale.Sizes) != 1 || o.Scale.Writers != 0 {
		t.Errorf("scale options set became %+v", o.Scale)
	}
}

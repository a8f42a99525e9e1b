package v1alpha1_test

import (
	"math"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/crdipc/crdipc/api/storage/v1alpha1"
)

func TestBytes(t *testing.T) {
	for _, tc := range []struct {
		q    string
		want int64
		err  bool
	}{
		{q: "1Gi", want: 1 << 30},
		{q: "1.5Gi", want: 3 << 29},
		{q: "1500m", want: 2}, // rounded up, as Quantity.Value rounds
		{q: "0.1", want: 1},
		{q: "0", want: 0},
		{q: "7Ei", want: 7 << 60},
		{q: "9223372036854775807", want: math.MaxInt64},
		{q: "16Ei", want: math.MaxInt64},      // resource.ParseQuantity clamps binary suffixes
		{q: "9223372036854775808", err: true}, // Value wraps this to a negative number
		{q: "1e30", err: true},                // Value says 0
		{q: "1e1000", err: true},
		{q: "-1Ki", want: -1024},
	} {
		got, err := v1alpha1.Bytes(resource.MustParse(tc.q))
		if tc.err {
			if err == nil || !strings.Contains(err.Error(), "out of range") {
				t.Errorf("Bytes(%s) = %d, %v; want an out-of-range error", tc.q, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Bytes(%s) = %d, %v; want %d", tc.q, got, err, tc.want)
		}
	}
}

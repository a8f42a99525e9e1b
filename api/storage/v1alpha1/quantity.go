package v1alpha1

import (
	"fmt"
	"math"
	"math/big"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Bytes is q as a whole number of bytes, rounded up as Quantity.Value rounds, or an error
// when that number does not fit an int64 — where Value would clamp or wrap around without a
// word. (A quantity with a binary suffix beyond 8Ei, such as 16Ei, is already clamped to
// 2^63-1 when parsed; that value fits, and is simply larger than any pool.)
func Bytes(q resource.Quantity) (int64, error) {
	if v, ok := q.AsInt64(); ok {
		return v, nil
	}
	d := q.AsDec()
	n := new(big.Int).Set(d.UnscaledBig())
	scale := int64(d.Scale()) // the value is n × 10^-scale
	switch {
	case n.Sign() == 0:
		return 0, nil
	case scale < -18:
		// At least 10^19 bytes: out of range, with no need to compute by how much.
		return 0, outOfRange(q)
	case scale < 0:
		n.Mul(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(-scale), nil))
	case scale > 0:
		// Euclidean division rounds down for a positive divisor; a remainder rounds up,
		// as Value does.
		var rem big.Int
		n.DivMod(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(scale), nil), &rem)
		if rem.Sign() != 0 {
			n.Add(n, big.NewInt(1))
		}
	}
	if !n.IsInt64() {
		return 0, outOfRange(q)
	}
	return n.Int64(), nil
}

func outOfRange(q resource.Quantity) error {
	return fmt.Errorf("quantity %s is out of range: a byte count must lie within ±%d", q.String(), int64(math.MaxInt64))
}

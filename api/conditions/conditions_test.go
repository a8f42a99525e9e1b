package conditions_test

import (
	"testing"

	"github.com/crdipc/crdipc/api/conditions"
)

func TestIsTerminal(t *testing.T) {
	for reason, want := range map[string]bool{
		conditions.ReasonFailed:      true,
		conditions.ReasonInvalidSpec: true,
		conditions.ReasonSucceeded:   false,
		conditions.ReasonPending:     false,
		conditions.ReasonReconciling: false,
		conditions.ReasonWaiting:     false,
		conditions.ReasonDegraded:    false,
		conditions.ReasonDeleting:    false,
		"":                           false,
	} {
		if got := conditions.IsTerminal(reason); got != want {
			t.Errorf("IsTerminal(%q) = %v, want %v", reason, got, want)
		}
	}
}

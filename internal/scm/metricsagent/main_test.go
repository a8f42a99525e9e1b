package metricsagent_test

import (
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/crdipc/crdipc/internal/testenv"
)

func TestMain(m *testing.M) {
	// The listener and agent use controller-runtime clients, which warn loudly when no
	// logger was ever set; the tests' output is for test failures.
	ctrllog.SetLogger(logr.Discard())
	testenv.Main(m)
}

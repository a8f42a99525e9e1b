package metricsagent_test

import (
	"testing"

	"github.com/crdipc/crdipc/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

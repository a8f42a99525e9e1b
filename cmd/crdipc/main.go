// Command crdipc runs crdipc's services; see `crdipc --help`.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/crdipc/crdipc/internal/cli"
)

func main() {
	if err := cli.NewRoot().ExecuteContext(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "crdipc:", err)
		os.Exit(cli.ExitCode(err))
	}
}

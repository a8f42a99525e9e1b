package cli

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/crdipc/crdipc/internal/storage/fdstore"
)

// DefaultFDHolderSocket is where config/csi's fd holder listens, on the node's disk, in a
// directory only it and the CSI node plugin mount.
const DefaultFDHolderSocket = fdstore.DefaultSocket

func newFDHolderCommand() *cobra.Command {
	socket := DefaultFDHolderSocket
	cmd := &cobra.Command{
		Use:   "fd-holder",
		Short: "Keep the CSI node plugin's FUSE connections while it restarts (one per node)",
		Long: `fd-holder keeps open file descriptors for processes that may die, as systemd's
file-descriptor store does: a process puts a descriptor in under a name over the Unix
socket --socket, and its successor gets it back (package fdstore has the protocol).
Only a process that can read the socket's directory, of the holder's own user, is
served: the holder makes the directory 0700 and writes a token into it that a client
must present. Mount that directory into the node plugin only.

The CSI node plugin (csi-driver --node-id ... --fd-holder=<socket>) keeps each staged
volume's FUSE connection here. While fd-holder holds it, the kernel keeps the
connection, its mount, the loop device and the file system on it when the plugin
restarts, is upgraded, crashes or is OOM-killed: the volume's I/O pauses, and the next
plugin process serves it again. fd-holder itself must outlive those restarts: it is
its own DaemonSet (config/csi/fd-holder.yaml), updated only on delete, with no API
access and no privileges. Stopping it while no plugin runs on its node ends every
connection it holds: those volumes' I/O fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := fdstore.Listen(socket)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			s := fdstore.New(log)
			defer s.Close()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			log.Info("fd holder serving", "socket", socket)
			if err := s.Serve(ctx, l); err != nil {
				return err
			}
			if names := s.Names(); len(names) > 0 {
				log.Warn("stopping with descriptors held: their connections end now", "held", len(names))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&socket, "socket", socket, "Unix socket (SOCK_SEQPACKET) to serve; its directory is created (or narrowed) 0700 and holds the token clients present")
	return cmd
}

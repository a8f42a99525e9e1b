package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/services"
	"github.com/crdipc/crdipc/internal/storage/storeref"
)

func newBackupCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "backup",
		Short: "Check the backups a BackupStore holds",
		Long: `backup works on a BackupStore of the cluster (docs/backup.md): it opens the store
with the Secrets the store names, as the operator does, so it needs a kubeconfig that
may read them (in crdipc-backup).`,
	}
	cmd.AddCommand(newBackupVerifyCommand())
	return cmd
}

func newBackupVerifyCommand() *cobra.Command {
	var (
		cluster     services.ClusterFlags
		concurrency int
	)
	cmd := &cobra.Command{
		Use:   "verify STORE",
		Short: "Read back every chunk of every backup in a BackupStore and report what is damaged",
		Long: `verify reads back every chunk that a backup in the store lists, decrypts it and
checks it against its name (a keyed hash of its contents). It prints how much it read,
then each chunk that is missing or damaged, with the backups it breaks (their
VolumeBackups, when the cluster has them).

It records each damaged copy in the store (damaged/, as a restore that meets one does):
the next backup of a volume that still holds the chunk's data uploads a good copy
instead of reusing it, as it does for a missing chunk, and the backups that list the
chunk restore again. Nothing else repairs a chunk: one that no volume holds any more
is lost. While verify runs, prunes delete nothing that a backup lists (it holds a
restore's marker).

Exit codes: 0 every chunk reads back; 1 a chunk is damaged or missing, or the store
could not be read.`,
		Example: `  crdipc backup verify offsite`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBackupVerify(cmd.Context(), cmd.OutOrStdout(), cluster, args[0], concurrency)
		},
	}
	cluster.AddFlags(cmd.Flags())
	cmd.Flags().IntVar(&concurrency, "concurrency", 4, "chunks read at once")
	return cmd
}

func runBackupVerify(ctx context.Context, out io.Writer, cluster services.ClusterFlags, name string, concurrency int) error {
	cfg, err := cluster.Config()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return err
	}
	var store storagev1alpha1.BackupStore
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &store); err != nil {
		return fmt.Errorf("backup store %s: %w", name, err)
	}
	repo, err := storeref.Open(ctx, c, &store, false)
	if err != nil {
		return fmt.Errorf("backup store %s: %w", name, err)
	}
	rep, err := repo.Verify(ctx, concurrency)
	if err != nil {
		return fmt.Errorf("verifying backup store %s: %w", name, err)
	}
	fmt.Fprintf(out, "%s: %d backups, %d chunks (%d bytes stored) read back\n", repo.Store(), rep.Backups, rep.Chunks, rep.Bytes)
	if rep.Damaged > 0 {
		fmt.Fprintf(out, "%d damaged copies recorded: the next backup holding their data uploads them again\n", rep.Damaged)
	}
	if len(rep.Bad) == 0 {
		fmt.Fprintln(out, "every chunk reads back as its name says")
		return nil
	}
	// Backups are named by ID in the store; the cluster's VolumeBackups give them names.
	names := map[string]string{}
	var list storagev1alpha1.VolumeBackupList
	if err := c.List(ctx, &list); err == nil {
		for _, b := range list.Items {
			id := b.Status.BackupID
			if a := b.Annotations[storagev1alpha1.AnnotationBackupID]; a != "" {
				id = a
			}
			if b.Spec.Store == name && id != "" {
				names[id] = b.Namespace + "/" + b.Name
			}
		}
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHUNK\tPROBLEM\tBACKUPS IT BREAKS")
	for _, bad := range rep.Bad {
		var backups []string
		for _, id := range bad.Backups {
			if n := names[id]; n != "" {
				id = n + " (" + id + ")"
			}
			backups = append(backups, id)
		}
		fmt.Fprintf(tw, "%s\t%v\t%v\n", bad.Chunk, bad.Err, backups)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return fmt.Errorf("%d damaged or missing chunks break %d backups", len(rep.Bad), len(rep.Broken()))
}

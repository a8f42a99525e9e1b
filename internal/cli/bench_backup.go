package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/crdipc/crdipc/internal/bench"
)

func newBenchBackupCommand() *cobra.Command {
	o := bench.DefaultBackupOptions
	var jsonPath string
	cmd := &cobra.Command{
		Use:   "backup",
		Short: "Measure backups to S3 against a local S3 server: throughput against its PUT and GET, the incremental upload, objects per GiB",
		Long: `backup starts a local S3 server (versitygw, from $PATH or $(go env GOPATH)/bin;
go install ` + "github.com/versity/versitygw/cmd/versitygw@v1.8.0" + ` installs it) under --dir,
writes a volume file of --size random bytes there, and measures in one run:

  floor        the volume's chunks read from the file and put to the server as
               they are, then got back into a file, with the same S3 client and
               --concurrency (MiB/s)
  backup       a full backup of the volume into a new store (chunk names, zstd,
               AES-256-GCM): MiB/s as a ratio to the floor's PUT (goal ≥ 0.7)
  restore      that backup restored into a file: MiB/s as a ratio to the
               floor's GET (goal ≥ 0.7), and the restored bytes compared
  objects      in the store after the full backup, per GiB (goal ≤ 300 at 4 MiB)
  incremental  a backup after --change percent of the volume, contiguous, was
               rewritten: the bytes it uploaded over the volume's (goal ≤ 0.02)

Random data does not compress, so the chunks stored are as large as they come.
Progress is printed to stderr while a backup or restore runs.`,
		Example: `  crdipc bench backup
  crdipc bench backup --size 4Gi --concurrency 8 --json backup.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Progress = cmd.ErrOrStderr()
			b, err := bench.MeasureBackup(cmd.Context(), o)
			if err != nil {
				return err
			}
			printBackup(cmd.OutOrStdout(), b)
			if jsonPath == "" {
				return nil
			}
			data, err := json.MarshalIndent(b, "", "  ")
			if err != nil {
				return err
			}
			return os.WriteFile(jsonPath, append(data, '\n'), 0o644)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Dir, "dir", "", "directory for the volume file, the restored file and the S3 server's buckets (default $TMPDIR)")
	f.Var(bytesFlag{&o.Size}, "size", "size of the volume backed up")
	f.IntVar(&o.ChunkSize, "chunk-size", o.ChunkSize, "chunk size of the store, in bytes (a multiple of 4096)")
	f.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "chunks uploaded or downloaded at once, by the floor and by crdipc")
	f.Float64Var(&o.ChangePercent, "change", o.ChangePercent, "percent of the volume rewritten before the incremental backup")
	f.StringVar(&jsonPath, "json", "", "also write the results as JSON to this file")
	return cmd
}

func printBackup(out io.Writer, b *bench.Backup) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backup\tMiB/s\tfloor MiB/s\tratio\t")
	fmt.Fprintf(tw, "full backup of %d MiB\t%.0f\t%.0f\t%.2f\t\n", b.Options.Size>>20, b.BackupMiBps, b.PutMiBps, b.BackupMiBps/b.PutMiBps)
	fmt.Fprintf(tw, "restore\t%.0f\t%.0f\t%.2f\t\n", b.RestoreMiBps, b.GetMiBps, b.RestoreMiBps/b.GetMiBps)
	tw.Flush()
	fmt.Fprintf(out, "objects after the full backup: %d (%.0f per GiB); after %.3g %% changed: %d bytes uploaded (%.2f %% of the volume)\n\n",
		b.Objects, b.ObjectsPerGiB, b.Options.ChangePercent, b.IncrementalBytes, 100*b.IncrementalRatio)
	printGoals(out, b.Goals(), false)
}

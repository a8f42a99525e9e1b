package bench

import "testing"

// TestParseFio reads a report as fio 3.33 writes it with --output-format=json, notes first.
func TestParseFio(t *testing.T) {
	out := []byte(`note: both iodepth >= 1 and synchronous I/O engine are selected, queue depth will be capped at 1
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "seqWrite",
      "error" : 0,
      "read" : {"io_bytes" : 0, "bw_bytes" : 0, "iops" : 0.000000},
      "write" : {
        "io_bytes" : 536870912, "bw_bytes" : 770233868, "iops" : 734.553,
        "clat_ns" : {"percentile" : {"50.000000" : 21626880, "99.000000" : 28966912}}
      }
    }
  ]
}
fio: some message after the report
`)
	r, err := parseFio(out, false)
	if err != nil {
		t.Fatal(err)
	}
	if r.Bytes != 512<<20 || r.IOPS != 734.553 || r.ClatP50 != 21.62688 || r.ClatP99 != 28.966912 || r.MiBPerSec < 734 || r.MiBPerSec > 735 {
		t.Fatalf("parsed %+v", r)
	}
	if _, err := parseFio(out, true); err == nil {
		t.Fatal("the reads of a write job: no error, want one (no data moved)")
	}
	if _, err := parseFio([]byte("fio: engine libaio not loadable\n"), false); err == nil {
		t.Fatal("no report: no error")
	}
}

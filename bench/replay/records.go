package replay

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"

	"github.com/kvrouter/kvrouter/bench/metrics"
)

// writeRecords writes recs to w as JSON lines, metrics.RecordLine each
// (nothing when w is nil).
func writeRecords(w io.Writer, path, policy string, seed uint64, recs []metrics.Record) error {
	if w == nil {
		return nil
	}
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range recs {
		if err := enc.Encode(recs[i].Line(path, policy, seed)); err != nil {
			return fmt.Errorf("replay: write records of %s: %w", policy, err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("replay: write records of %s: %w", policy, err)
	}
	return nil
}

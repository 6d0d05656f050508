package host

import (
	"testing"

	"github.com/kvrouter/kvrouter/router/api"
)

// GET /v1/workers shows each rank's last load report and its age.
func TestWorkersShowReportedLoad(t *testing.T) {
	st := startStack(t, stackOpts{workers: 1, replicas: 1})
	st.waitWorkers(1)
	st.waitWorker("sim-0", func(ws api.WorkerStatus) bool {
		r := ws.Reported
		return r != nil && r.KVTotalBlocks == 4096 && r.Running == 0 && r.Waiting == 0 && r.KVUsage >= 0 &&
			r.AgeMS >= 0 && r.AgeMS < 10_000
	})
}

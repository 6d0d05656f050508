package replay

import (
	"github.com/kvrouter/kvrouter/bench/workload"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workers/sim"
)

// prepared is a workload request with everything the driver sends, computed
// once and shared by every policy (read only while replaying).
type prepared struct {
	req          *workload.Request
	hashes       []kvevents.SeqHash // full blocks at the engine block size
	blockHashes  []uint64           // the same, as the route API wants them
	promptBlocks int
	// maxTokens is the max_tokens the client sends: all the route API and
	// every booking learn of the reply's length.
	maxTokens int
	// outputTokens is the reply's true length: the workload's output, at
	// most maxTokens (the engine stops there) and the replay's output cap.
	// Only the engine is told it, as its model's end of sequence.
	outputTokens int
}

// prepare hashes every prompt the way engine and router do: Mooncake block
// ids expand to tokens with sim.ExpandBlockIDs, then kvevents.SeqHashes with
// the default seed (no LoRA, no salt). maxTokens is the client's max_tokens,
// maxOutput the replay's output cap (0 = none).
func prepare(w *workload.Workload, blockSize, maxOutput, maxTokens int) []prepared {
	seed := kvevents.SeedFor("", "")
	out := make([]prepared, len(w.Requests))
	var buf []uint32
	for i := range w.Requests {
		r := &w.Requests[i]
		toks := r.Tokens
		if len(r.BlockIDs) > 0 {
			buf = sim.ExpandBlockIDs(buf[:0], r.BlockIDs, w.BlockTokens, r.InputLength)
			toks = buf
		}
		hs := kvevents.SeqHashes(make([]kvevents.SeqHash, 0, len(toks)/blockSize), toks, blockSize, seed)
		u := make([]uint64, len(hs))
		for j, h := range hs {
			u[j] = uint64(h)
		}
		outTok := min(max(1, r.OutputLength), maxTokens)
		if maxOutput > 0 {
			outTok = min(outTok, maxOutput)
		}
		out[i] = prepared{req: r, hashes: hs, blockHashes: u, promptBlocks: len(hs), maxTokens: maxTokens, outputTokens: outTok}
	}
	return out
}

// generateRequest is what the worker receives on the NATS path: the
// simulator's own generate call, whose MaxTokens is the reply's true length
// (the model ending its reply). No router sees it.
func (p *prepared) generateRequest(id string, blockTokens int) *sim.GenerateRequest {
	g := &sim.GenerateRequest{RequestID: id, MaxTokens: p.outputTokens}
	if len(p.req.BlockIDs) > 0 {
		g.BlockIDs = p.req.BlockIDs
		g.BlockTokens = blockTokens
		g.InputLength = p.req.InputLength
	} else {
		g.TokenIDs = p.req.Tokens
	}
	return g
}

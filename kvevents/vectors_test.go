package kvevents

import (
	"os"
	"path/filepath"
	"testing"
)

// vllmVectorFiles are the shared vLLM KVEventBatch test vectors.
var vllmVectorFiles = []string{
	"vllm_kvbatch_A_map_events.bin",
	"vllm_kvbatch_B_positional_events.bin",
	"vllm_kvbatch_C_positional_v0.10.bin",
}

// vllmVectorDir finds shared/testvectors/vllm by walking up from the
// package directory (the repository sits next to shared/, e.g.
// /work/main/kvevents -> /work/shared/testvectors/vllm). It returns "" when
// there is no such directory.
func vllmVectorDir() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		cand := filepath.Join(dir, "shared", "testvectors", "vllm")
		if st, err := os.Stat(cand); err == nil && st.IsDir() {
			return cand
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// loadVLLMVectors returns the vector files by name, or skips the test.
func loadVLLMVectors(t testing.TB) map[string][]byte {
	t.Helper()
	dir := vllmVectorDir()
	if dir == "" {
		t.Skip("shared/testvectors/vllm not found above the package directory; skipping vLLM vector tests")
	}
	out := make(map[string][]byte)
	for _, name := range vllmVectorFiles {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("read vector: %v", err)
		}
		out[name] = b
	}
	return out
}

// loadVLLMVectorsForFuzz returns whatever vectors exist, for fuzz seeds.
func loadVLLMVectorsForFuzz() [][]byte {
	dir := vllmVectorDir()
	if dir == "" {
		return nil
	}
	var out [][]byte
	for _, name := range vllmVectorFiles {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err == nil {
			out = append(out, b)
		}
	}
	return out
}

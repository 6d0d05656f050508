package vllm

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The vLLM KVEventBatch test vectors live in testdata/vllm, copied from
// shared/testvectors/vllm (their source of truth, next to the repository on
// the development machines) so that they run on a fresh clone.
// TestVLLMVectorCopiesMatchShared keeps the copies honest.
const vllmVectorDir = "testdata/vllm"

// vllmVectorFiles are the vectors' payloads, in a fixed order.
var vllmVectorFiles = []string{
	"vllm_kvbatch_A_map_events.bin",
	"vllm_kvbatch_B_positional_events.bin",
	"vllm_kvbatch_C_positional_v0.10.bin",
}

// loadVLLMVectors returns the vector payloads by name. A missing or
// unreadable copy fails the test: the vectors are part of the repository.
func loadVLLMVectors(t testing.TB) map[string][]byte {
	t.Helper()
	out := make(map[string][]byte, len(vllmVectorFiles))
	for _, name := range vllmVectorFiles {
		b, err := os.ReadFile(filepath.Join(vllmVectorDir, name))
		if err != nil {
			t.Fatalf("read vLLM vector: %v", err)
		}
		out[name] = b
	}
	return out
}

// TestVLLMVectorHexMatchesBin: each .hex is its .bin in hex, so an edit to
// one of the pair shows.
func TestVLLMVectorHexMatchesBin(t *testing.T) {
	vecs := loadVLLMVectors(t)
	for _, name := range vllmVectorFiles {
		hexName := strings.TrimSuffix(name, ".bin") + ".hex"
		text, err := os.ReadFile(filepath.Join(vllmVectorDir, hexName))
		if err != nil {
			t.Fatalf("read %s: %v", hexName, err)
		}
		b, err := hex.DecodeString(strings.Join(strings.Fields(string(text)), ""))
		if err != nil {
			t.Fatalf("%s: %v", hexName, err)
		}
		if !bytes.Equal(b, vecs[name]) {
			t.Errorf("%s does not spell %s (%d bytes vs %d)", hexName, name, len(b), len(vecs[name]))
		}
	}
}

// sharedVLLMVectorDir finds shared/testvectors/vllm by walking up from the
// package directory (the repository sits next to shared/, e.g.
// /work/main/kvevents/vllm -> /work/shared/testvectors/vllm). It returns ""
// when there is no such directory, as on a fresh clone.
func sharedVLLMVectorDir(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("getwd: %v", err)
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

// TestVLLMVectorCopiesMatchShared: testdata/vllm holds exactly the files of
// shared/testvectors/vllm, byte for byte, when that directory is present.
func TestVLLMVectorCopiesMatchShared(t *testing.T) {
	shared := sharedVLLMVectorDir(t)
	if shared == "" {
		t.Skip("shared/testvectors/vllm (the vectors' source of truth) is not above the package directory; " +
			"the copies in testdata/vllm are used as they are")
	}
	names := func(dir string) []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatalf("list %s: %v", dir, err)
		}
		var out []string
		for _, e := range ents {
			if !e.IsDir() {
				out = append(out, e.Name())
			}
		}
		return out
	}
	want, got := names(shared), names(vllmVectorDir)
	if !slices.Equal(want, got) {
		t.Fatalf("testdata/vllm has %v, %s has %v: copy the shared vectors again", got, shared, want)
	}
	for _, name := range want {
		a, errA := os.ReadFile(filepath.Join(shared, name))
		b, errB := os.ReadFile(filepath.Join(vllmVectorDir, name))
		if errA != nil || errB != nil {
			t.Fatalf("read %s: %v / %v", name, errA, errB)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("testdata/vllm/%s differs from %s: copy the shared vectors again", name, filepath.Join(shared, name))
		}
	}
}

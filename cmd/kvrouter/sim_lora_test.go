package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestExpandNargs(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{[]string{"m", "--lora-modules", "a=/p", "b=/q", "--port", "9"},
			[]string{"m", "--lora-modules", "a=/p", "--lora-modules", "b=/q", "--port", "9"}},
		{[]string{"--lora-modules", "a=/p", `{"name":"b","path":"/q"}`, "m"},
			[]string{"--lora-modules", "a=/p", "--lora-modules", `{"name":"b","path":"/q"}`, "m"}},
		{[]string{"--lora-modules=a=/p", "m"}, []string{"--lora-modules=a=/p", "m"}},
		{[]string{"--", "--lora-modules", "a=/p", "b=/q"}, []string{"--", "--lora-modules", "a=/p", "b=/q"}},
	} {
		if got := expandNargs(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("expandNargs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestSimServeLoRAUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"sim", "serve", "m", "--lora-modules", "a=/p"}, // without --enable-lora
		{"sim", "serve", "m", "--enable-lora", "--lora-modules", "a"},
		{"sim", "serve", "m", "--enable-lora", "--max-loras", "0"},
		{"sim", "serve", "m", "--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"},
		{"sim", "serve", "m", "--enable-lora", "--max-lora-rank", "7"},
		{"sim", "serve", "m", "--enable-lora", "--lora-modules", "m=/p"}, // the served model's name
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, &out, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", args, code, errOut.String())
		}
	}
}

// vLLM's LoRA flags, several modules after one --lora-modules, both forms:
// the adapters are model cards with their parent, requests for them run,
// and with VLLM_ALLOW_RUNTIME_LORA_UPDATING one more loads at run time.
func TestSimServeLoRAAdapters(t *testing.T) {
	t.Setenv(runtimeLoRAEnv, "True")
	engine := runOnPort(t, freePort(t), func(port int) []string {
		return []string{"sim", "serve", "base", "--host", "127.0.0.1", "--port", strconv.Itoa(port),
			"--enable-lora", "--lora-modules", "sql=/a/sql", `{"name":"zh","path":"/a/zh","base_model_name":"base"}`,
			"--max-loras", "2", "--max-cpu-loras", "4", "--lora-load-time", "1s", "--speedup", "100", "--log-level", "error"}
	}, func(c *command) bool { return strings.Contains(c.out.String(), "on http://") })
	defer engine.stop()
	port, out := engine.port(), engine.out // out: the startup line
	if !strings.Contains(out.String(), `LoRA adapters ["sql" "zh"], 2 resident at once, runtime loading on`) {
		t.Errorf("startup line %q", out.String())
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	client := &http.Client{Timeout: 20 * time.Second}
	defer client.CloseIdleConnections()
	call := func(path, body string) (int, string) {
		t.Helper()
		resp, err := client.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := call("/v1/load_lora_adapter", `{"lora_name":"fr","lora_path":"/a/fr"}`); code != 200 {
		t.Fatalf("load: %d %s", code, body)
	}
	resp, err := client.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	var ids []string
	for _, m := range models.Data {
		p := "null"
		if m.Parent != nil {
			p = *m.Parent
		}
		ids = append(ids, m.ID+"<"+p)
	}
	if err != nil || !slices.Equal(ids, []string{"base<null", "sql<base", "zh<base", "fr<base"}) {
		t.Fatalf("/v1/models: %v %q", err, ids)
	}
	for _, m := range []string{"sql", "zh", "fr"} {
		if code, body := call("/v1/completions", `{"model":"`+m+`","prompt":"hello","max_tokens":1}`); code != 200 {
			t.Fatalf("%s: %d %s", m, code, body)
		}
	}
	engine.stop()
	if code := <-engine.done; code != 0 {
		t.Fatalf("exit %d: %s", code, engine.errb)
	}
}

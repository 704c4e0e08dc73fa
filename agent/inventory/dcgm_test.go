package inventory_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/expfmt"

	"github.com/flotilla-gitops/flotilla/agent/inventory"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
)

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Statuses of the GPUs in the testdata pages.
var (
	defaultCountersGPUs = []protocol.GPUStatus{
		{Node: "gpu-node-a", GPU: "0", UUID: "GPU-5c3e5b0a-8f6e-2a41-9d2f-3b1a7e0c4d11", Model: "NVIDIA A10", Health: "ok", TempC: 61},
		{Node: "gpu-node-a", GPU: "1", UUID: "GPU-b07d1f4e-33c2-6f0a-8e1b-9a2c5d7e6f22", Model: "NVIDIA A10", Health: "degraded", XIDErrors: 79, TempC: 38},
	}
	healthCountersGPUs = []protocol.GPUStatus{
		{Node: "gpu-node-b", GPU: "0", UUID: "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9", Model: "NVIDIA A100-SXM4-80GB", Health: "ok", TempC: 34},
		{Node: "gpu-node-b", GPU: "1", UUID: "GPU-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f90a", Model: "NVIDIA A100-SXM4-80GB", Health: "failed", XIDErrors: 48, TempC: 41},
		{Node: "gpu-node-b", GPU: "2", UUID: "GPU-2c3d4e5f-6071-8293-a4b5-c6d7e8f90a1b", Model: "NVIDIA A100-SXM4-80GB", Health: "failed", XIDErrors: 64},
		{Node: "gpu-node-b", GPU: "3", UUID: "GPU-3d4e5f60-7182-93a4-b5c6-d7e8f90a1b2c", Model: "NVIDIA A100-SXM4-80GB", Health: "ok", TempC: 83, Violations: "power=1.5s,thermal=12ms"},
	}
	migGPUs = []protocol.GPUStatus{
		{Node: "gpu-node-c", GPU: "0", UUID: "GPU-4e5f6071-8293-a4b5-c6d7-e8f90a1b2c3d", Model: "NVIDIA A100-SXM4-80GB", Health: "degraded", XIDErrors: 31, TempC: 52},
		{Node: "gpu-node-c", GPU: "1", UUID: "GPU-5f607182-93a4-b5c6-d7e8-f90a1b2c3d4e", Model: "NVIDIA A100-SXM4-80GB", Health: "ok", TempC: 39},
	}
)

func TestParseDCGM(t *testing.T) {
	tests := []struct {
		name string
		page string
		want []protocol.GPUStatus
	}{
		{
			name: "default counters: an XID error degrades the GPU, blank memory temperatures are ignored",
			page: string(fixture(t, "dcgm-default-counters.txt")),
			want: defaultCountersGPUs,
		},
		{
			name: "ECC and violation counters: double-bit errors or a failed row remap fail the GPU, throttling is only reported",
			page: string(fixture(t, "dcgm-health-counters.txt")),
			want: healthCountersGPUs,
		},
		{
			name: "series of one GPU's MIG instances and pods are merged",
			page: string(fixture(t, "dcgm-mig.txt")),
			want: migGPUs,
		},
		{
			name: "the old lower-case uuid label is read",
			page: `DCGM_FI_DEV_GPU_TEMP{gpu="0",uuid="GPU-8d4e",modelName="Tesla T4",Hostname="t4-node"} 40` + "\n",
			want: []protocol.GPUStatus{{Node: "t4-node", GPU: "0", UUID: "GPU-8d4e", Model: "Tesla T4", Health: "ok", TempC: 40}},
		},
		{
			name: "a blank XID value is no XID error",
			page: "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n" +
				`DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1",Hostname="n"} 9223372036854775792` + "\n",
			want: []protocol.GPUStatus{{Node: "n", GPU: "0", UUID: "GPU-1", Health: "ok"}},
		},
		{
			name: "a GPU seen only in metrics not read for health is ok",
			page: `DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",modelName="NVIDIA L4",Hostname="n"} 1024` + "\n",
			want: []protocol.GPUStatus{{Node: "n", GPU: "0", UUID: "GPU-1", Model: "NVIDIA L4", Health: "ok"}},
		},
		{
			name: "GPUs are sorted by node, then by index as a number",
			page: `DCGM_FI_DEV_GPU_TEMP{gpu="10",UUID="GPU-10",Hostname="b"} 1` + "\n" +
				`DCGM_FI_DEV_GPU_TEMP{gpu="2",UUID="GPU-2",Hostname="b"} 1` + "\n" +
				`DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-1",Hostname="b"} 1` + "\n" +
				`DCGM_FI_DEV_GPU_TEMP{gpu="3",UUID="GPU-3",Hostname="a"} 1` + "\n",
			want: []protocol.GPUStatus{
				{Node: "a", GPU: "3", UUID: "GPU-3", Health: "ok", TempC: 1},
				{Node: "b", GPU: "1", UUID: "GPU-1", Health: "ok", TempC: 1},
				{Node: "b", GPU: "2", UUID: "GPU-2", Health: "ok", TempC: 1},
				{Node: "b", GPU: "10", UUID: "GPU-10", Health: "ok", TempC: 1},
			},
		},
		{
			name: "series of no GPU and the exporter's own metrics are ignored",
			page: `DCGM_FI_DEV_NVSWITCH_TEMPERATURE_CURRENT{nvswitch="0",Hostname="n"} 46` + "\n" +
				"# TYPE go_goroutines gauge\ngo_goroutines 12\n",
			want: []protocol.GPUStatus{},
		},
		{
			name: "an empty page has no GPUs",
			page: "",
			want: []protocol.GPUStatus{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := inventory.ParseDCGM(strings.NewReader(tt.page))
			if err != nil {
				t.Fatalf("ParseDCGM: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseDCGM (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseDCGMNamesTheMalformedLine(t *testing.T) {
	const ok = "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
	tests := []struct {
		name string
		page string
		line int
	}{
		{"a value that is no number", ok + `DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1"} hot` + "\n", 3},
		{"a label value with a new-line", ok + `DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1` + "\n" + `"} 1` + "\n", 3},
		{"an unknown metric type", "# TYPE DCGM_FI_DEV_GPU_TEMP thermometer\n", 1},
		{"a last line cut off before its value", ok + `DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1"}`, 3},
		{"an HTML page", "<html><body>502 Bad Gateway</body></html>\n", 1},
		{"a second TYPE line", ok + "# TYPE DCGM_FI_DEV_GPU_TEMP counter\n", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := inventory.ParseDCGM(strings.NewReader(tt.page))
			if err == nil {
				t.Fatalf("ParseDCGM gave %v, want an error", got)
			}
			var pe expfmt.ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %q is no expfmt.ParseError", err)
			}
			if pe.Line != tt.line {
				t.Errorf("error %q names line %d, want %d", err, pe.Line, tt.line)
			}
			if want := fmt.Sprintf("line %d", tt.line); !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		})
	}
}

// padding is n bytes of comment lines, which the text format ignores.
func padding(t *testing.T, n int) []byte {
	t.Helper()
	if n != 0 && n < 3 {
		t.Fatalf("cannot pad with %d bytes", n)
	}
	var b bytes.Buffer
	for n > 0 {
		l := min(n, 1024)
		if rest := n - l; rest > 0 && rest < 3 {
			l -= 3
		}
		b.WriteString("# ")
		b.WriteString(strings.Repeat("x", l-3))
		b.WriteByte('\n')
		n -= l
	}
	return b.Bytes()
}

// endless is an exporter that never stops answering.
type endless struct{ read int64 }

func (e *endless) Read(p []byte) (int, error) {
	const line = "# still here\n"
	for i := range p {
		p[i] = line[(e.read+int64(i))%int64(len(line))]
	}
	e.read += int64(len(p))
	return len(p), nil
}

func TestParseDCGMCapsWhatItReads(t *testing.T) {
	page := fixture(t, "dcgm-default-counters.txt")

	t.Run("a page of exactly the cap is read", func(t *testing.T) {
		full := append(bytes.Clone(page), padding(t, inventory.MaxDCGMBytes-len(page))...)
		if len(full) != inventory.MaxDCGMBytes {
			t.Fatalf("page is %d bytes, want %d", len(full), inventory.MaxDCGMBytes)
		}
		got, err := inventory.ParseDCGM(bytes.NewReader(full))
		if err != nil {
			t.Fatalf("ParseDCGM: %v", err)
		}
		if diff := cmp.Diff(defaultCountersGPUs, got); diff != "" {
			t.Errorf("ParseDCGM (-want +got):\n%s", diff)
		}
	})

	t.Run("a page one byte over the cap is refused", func(t *testing.T) {
		over := append(bytes.Clone(page), padding(t, inventory.MaxDCGMBytes+1-len(page))...)
		got, err := inventory.ParseDCGM(bytes.NewReader(over))
		if !errors.Is(err, inventory.ErrDCGMTooLarge) {
			t.Fatalf("ParseDCGM gave %v, %v; want ErrDCGMTooLarge", got, err)
		}
		if !strings.Contains(err.Error(), "8 MiB") {
			t.Errorf("error %q does not say the cap", err)
		}
	})

	t.Run("an endless answer is read no further than the cap", func(t *testing.T) {
		e := &endless{}
		_, err := inventory.ParseDCGM(io.MultiReader(bytes.NewReader(page), e))
		if !errors.Is(err, inventory.ErrDCGMTooLarge) {
			t.Fatalf("ParseDCGM: %v, want ErrDCGMTooLarge", err)
		}
		// The cap, and the one byte that shows there is more.
		if got, want := int64(len(page))+e.read, int64(inventory.MaxDCGMBytes)+1; got != want {
			t.Errorf("read %d bytes, want %d", got, want)
		}
	})
}

func TestParseDCGMReadsLongPagesWhole(t *testing.T) {
	// Long enough that any sensible parser reads it in several parts.
	long := padding(t, inventory.MaxDCGMBytes/2)
	longLines := bytes.Count(long, []byte("\n"))

	t.Run("a malformed line far down the page is named by its line", func(t *testing.T) {
		page := string(long) + "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" + `DCGM_FI_DEV_GPU_TEMP{gpu="0"} hot` + "\n"
		_, err := inventory.ParseDCGM(strings.NewReader(page))
		var pe expfmt.ParseError
		if !errors.As(err, &pe) {
			t.Fatalf("ParseDCGM: %v, want an expfmt.ParseError", err)
		}
		if want := longLines + 2; pe.Line != want {
			t.Errorf("error %q names line %d, want %d", err, pe.Line, want)
		}
	})

	t.Run("a family whose TYPE is far from its samples is read", func(t *testing.T) {
		page := "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n" + string(long) +
			`DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1",Hostname="n"} 79` + "\n"
		got, err := inventory.ParseDCGM(strings.NewReader(page))
		if err != nil {
			t.Fatalf("ParseDCGM: %v", err)
		}
		want := []protocol.GPUStatus{{Node: "n", GPU: "0", UUID: "GPU-1", Health: "degraded", XIDErrors: 79}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("ParseDCGM (-want +got):\n%s", diff)
		}
	})
}

func TestParseDCGMCapsTheGPUs(t *testing.T) {
	page := func(n int) string {
		var b strings.Builder
		b.WriteString("# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n")
		for i := range n {
			fmt.Fprintf(&b, "DCGM_FI_DEV_GPU_TEMP{gpu=\"%d\",UUID=\"GPU-%d\",Hostname=\"n\"} 40\n", i, i)
		}
		return b.String()
	}
	got, err := inventory.ParseDCGM(strings.NewReader(page(inventory.MaxDCGMGPUs)))
	if err != nil || len(got) != inventory.MaxDCGMGPUs {
		t.Fatalf("ParseDCGM of %d GPUs gave %d, %v", inventory.MaxDCGMGPUs, len(got), err)
	}
	if _, err := inventory.ParseDCGM(strings.NewReader(page(inventory.MaxDCGMGPUs + 1))); !errors.Is(err, inventory.ErrDCGMTooManyGPUs) {
		t.Fatalf("ParseDCGM of %d GPUs: %v, want ErrDCGMTooManyGPUs", inventory.MaxDCGMGPUs+1, err)
	}
}

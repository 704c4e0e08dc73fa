package inventory

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
)

// MaxDCGMBytes is the most ParseDCGM reads. A real exporter's page is tens of kilobytes per
// node; the cap only keeps a broken or hostile endpoint from exhausting the agent's memory.
const MaxDCGMBytes = 8 << 20

// MaxDCGMGPUs is the most GPUs ParseDCGM keeps. One exporter serves the few GPUs of one
// node; the cap leaves room for an endpoint that aggregates many nodes' exporters while
// bounding what a page of made-up GPUs can make the agent keep.
const MaxDCGMGPUs = 4096

// ErrDCGMTooLarge is returned for a metrics page longer than MaxDCGMBytes.
var ErrDCGMTooLarge = fmt.Errorf("DCGM exporter metrics are larger than %d MiB", MaxDCGMBytes>>20)

// ErrDCGMTooManyGPUs is returned for a metrics page of more than MaxDCGMGPUs GPUs.
var ErrDCGMTooManyGPUs = fmt.Errorf("DCGM exporter metrics describe more than %d GPUs", MaxDCGMGPUs)

// Health values of protocol.GPUStatus.
const (
	HealthOK       = "ok"
	HealthDegraded = "degraded"
	HealthFailed   = "failed"
)

// dcgm-exporter's metric names, which are the DCGM field names (its etc/default-counters.csv).
// Of these only DCGM_FI_DEV_GPU_TEMP, DCGM_FI_DEV_XID_ERRORS and DCGM_FI_DEV_ROW_REMAP_FAILURE
// are collected by default; the ECC and violation counters are commented out there and read
// when an operator enables them.
const (
	metricTemp         = "DCGM_FI_DEV_GPU_TEMP"
	metricXID          = "DCGM_FI_DEV_XID_ERRORS"
	metricDBEVolatile  = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
	metricRemapFailure = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
)

// violationCounters are the throttling counters (microseconds) reported in
// GPUStatus.Violations, in the order they are listed there. DCGM_FI_DEV_LOW_UTIL_VIOLATION
// is left out: clocks lowered on an idle GPU are no sign of trouble.
func violationCounters() [numViolations]struct{ metric, name string } {
	return [numViolations]struct{ metric, name string }{
		{"DCGM_FI_DEV_POWER_VIOLATION", "power"},
		{"DCGM_FI_DEV_THERMAL_VIOLATION", "thermal"},
		{"DCGM_FI_DEV_RELIABILITY_VIOLATION", "reliability"},
		{"DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "board_limit"},
		{"DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "sync_boost"},
	}
}

const numViolations = 5

// Labels dcgm-exporter puts on every GPU metric (its GPU metrics template). The UUID
// label's name is configurable; older exporters and --use-old-namespace write "uuid".
const (
	labelGPU      = "gpu"
	labelUUID     = "UUID"
	labelUUIDOld  = "uuid"
	labelModel    = "modelName"
	labelHostname = "Hostname"
)

// ParseDCGM reads a dcgm-exporter metrics page (Prometheus text format) into one status per
// GPU, keyed by the labels Hostname, gpu and UUID and sorted in that order. Series without a
// gpu label (NVSwitch, NVLink, CPU metrics) are ignored. Several series of one GPU, e.g. one
// per MIG instance or per pod using it, are merged: the largest value of each metric wins.
//
// Health is HealthFailed when the GPU has double-bit (uncorrectable) ECC errors since the
// driver loaded (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0) or row remapping failed
// (DCGM_FI_DEV_ROW_REMAP_FAILURE > 0): both mean memory the GPU cannot be trusted with
// until it is reset or serviced. Otherwise it is HealthDegraded when an XID error was
// reported (DCGM_FI_DEV_XID_ERRORS, the last XID code, is not 0), and HealthOK when neither.
// Throttling is reported in Violations but does not change Health. DCGM's "blank" values
// (no data, not supported) count as absent.
//
// At most MaxDCGMBytes are read; a longer page gives ErrDCGMTooLarge. A page of more than
// MaxDCGMGPUs GPUs gives ErrDCGMTooManyGPUs. A malformed page gives an error naming the
// line (an expfmt.ParseError).
func ParseDCGM(r io.Reader) ([]protocol.GPUStatus, error) {
	capped := &cappedReader{r: r, left: MaxDCGMBytes}
	gpus := map[gpuKey]*gpuValues{}
	if err := parseChunks(bufio.NewReaderSize(capped, 64<<10), gpus); err != nil {
		if capped.exceeded {
			return nil, ErrDCGMTooLarge
		}
		return nil, err
	}

	out := make([]protocol.GPUStatus, 0, len(gpus))
	for key, v := range gpus {
		out = append(out, v.status(key))
	}
	slices.SortFunc(out, func(a, b protocol.GPUStatus) int {
		return cmp.Or(
			cmp.Compare(a.Node, b.Node),
			compareIndex(a.GPU, b.GPU),
			cmp.Compare(a.UUID, b.UUID),
		)
	})
	return out, nil
}

// chunkBytes is about how much of the page is parsed at once. expfmt's parse of a page takes
// some twenty times the page's size; parsed in chunks, and kept only as the few values per
// GPU read here, a page at the cap takes a few megabytes instead of a hundred and more.
const chunkBytes = 256 << 10

// parseChunks parses the page a chunk of whole lines at a time into gpus. A metric family
// split between two chunks loses its TYPE in the second, which only makes its samples
// untyped; their values are read all the same.
func parseChunks(br *bufio.Reader, gpus map[gpuKey]*gpuValues) error {
	var (
		chunk bytes.Buffer
		first = 1 // line number of the chunk's first line
		lines int // whole lines in the chunk
	)
	flush := func() error {
		if chunk.Len() == 0 {
			return nil
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(&chunk)
		if err != nil {
			var pe expfmt.ParseError
			if errors.As(err, &pe) {
				pe.Line += first - 1
				err = pe
			}
			return fmt.Errorf("parsing DCGM exporter metrics: %w", err)
		}
		if err := accumulate(families, gpus); err != nil {
			return err
		}
		first += lines
		lines = 0
		chunk.Reset()
		return nil
	}
	for {
		frag, err := br.ReadSlice('\n')
		chunk.Write(frag)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue // a line longer than the buffer goes on
		}
		if len(frag) > 0 && frag[len(frag)-1] == '\n' {
			lines++
			if chunk.Len() >= chunkBytes {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return flush()
		}
		if err != nil {
			return fmt.Errorf("reading DCGM exporter metrics: %w", err)
		}
	}
}

// accumulate folds the families' samples into gpus.
func accumulate(families map[string]*dto.MetricFamily, gpus map[gpuKey]*gpuValues) error {
	for name, f := range families {
		// Every DCGM_FI_DEV_ metric makes its GPU known, so that a GPU is listed, with
		// nothing wrong reported, also when the exporter collects none of the fields read
		// for health.
		if !strings.HasPrefix(name, "DCGM_FI_DEV_") {
			continue
		}
		set := setter(name)
		for _, m := range f.GetMetric() {
			key, ok := keyOf(m)
			if !ok {
				continue
			}
			v := gpus[key]
			if v == nil {
				if len(gpus) == MaxDCGMGPUs {
					return ErrDCGMTooManyGPUs
				}
				v = &gpuValues{}
				gpus[key] = v
			}
			if v.model == "" {
				v.model = label(m, labelModel)
			}
			if x, ok := value(m); ok && set != nil {
				set(v, x)
			}
		}
	}
	return nil
}

// setter is how a sample of the metric is kept, nil for metrics not read.
func setter(metric string) func(v *gpuValues, x float64) {
	switch metric {
	case metricTemp:
		return func(v *gpuValues, x float64) { v.temp = max(v.temp, x) }
	case metricXID:
		return func(v *gpuValues, x float64) { v.xid = max(v.xid, x) }
	case metricDBEVolatile:
		return func(v *gpuValues, x float64) { v.dbe = max(v.dbe, x) }
	case metricRemapFailure:
		return func(v *gpuValues, x float64) { v.remapFailure = max(v.remapFailure, x) }
	}
	for i, vi := range violationCounters() {
		if vi.metric == metric {
			return func(v *gpuValues, x float64) { v.violations[i] = max(v.violations[i], x) }
		}
	}
	return nil
}

type gpuKey struct{ node, gpu, uuid string }

type gpuValues struct {
	model        string
	temp         float64
	xid          float64
	dbe          float64
	remapFailure float64
	violations   [numViolations]float64
}

func (v *gpuValues) status(key gpuKey) protocol.GPUStatus {
	s := protocol.GPUStatus{
		Node:   key.node,
		GPU:    key.gpu,
		UUID:   key.uuid,
		Model:  v.model,
		Health: HealthOK,
		TempC:  v.temp,
	}
	// XID codes are small integers; the clamp only guards the conversion.
	s.XIDErrors = int(min(v.xid, math.MaxInt32))
	switch {
	case v.dbe > 0 || v.remapFailure > 0:
		s.Health = HealthFailed
	case s.XIDErrors != 0:
		s.Health = HealthDegraded
	}
	var parts []string
	for i, vi := range violationCounters() {
		if us := v.violations[i]; us > 0 {
			d := time.Duration(min(us, float64(math.MaxInt64/int64(time.Microsecond)))) * time.Microsecond
			parts = append(parts, vi.name+"="+d.String())
		}
	}
	s.Violations = strings.Join(parts, ",")
	return s
}

// keyOf is the GPU a series is of; false for series of no GPU.
func keyOf(m *dto.Metric) (gpuKey, bool) {
	gpu := label(m, labelGPU)
	if gpu == "" {
		return gpuKey{}, false
	}
	uuid := label(m, labelUUID)
	if uuid == "" {
		uuid = label(m, labelUUIDOld)
	}
	return gpuKey{node: label(m, labelHostname), gpu: gpu, uuid: uuid}, true
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// value is the sample's value, false when there is none: NaN, or one of DCGM's blank
// values, which the exporter prints as they are (e.g. 9223372036854775794 for "not
// supported") and which start at DCGM_INT64_BLANK, 0x7ffffffffffffff0. As a float64 they
// all round to 2^63, so anything that large is blank; no real reading comes near.
func value(m *dto.Metric) (float64, bool) {
	var x float64
	switch {
	case m.GetGauge() != nil:
		x = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		x = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		x = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(x) || x >= dcgmInt64Blank {
		return 0, false
	}
	return x, true
}

// dcgmInt64Blank is DCGM_INT64_BLANK as a float64.
const dcgmInt64Blank = float64(0x7ffffffffffffff0)

// compareIndex orders GPU indices as numbers, "2" before "10"; non-numbers after numbers.
func compareIndex(a, b string) int {
	x, errA := strconv.Atoi(a)
	y, errB := strconv.Atoi(b)
	switch {
	case errA == nil && errB == nil:
		return cmp.Compare(x, y)
	case errA == nil:
		return -1
	case errB == nil:
		return 1
	}
	return cmp.Compare(a, b)
}

// cappedReader reads at most left bytes of r. Reading past that fails with ErrDCGMTooLarge,
// and sets exceeded, when r has more; a page of exactly the cap is read in full.
type cappedReader struct {
	r        io.Reader
	left     int64
	exceeded bool
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.exceeded {
		return 0, ErrDCGMTooLarge
	}
	if c.left <= 0 {
		var probe [1]byte
		if n, err := io.ReadFull(c.r, probe[:]); n == 0 {
			return 0, err // io.EOF: the page ends at the cap
		}
		c.exceeded = true
		return 0, ErrDCGMTooLarge
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

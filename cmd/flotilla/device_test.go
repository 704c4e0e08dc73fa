package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestDeviceListShowsTheInventory(t *testing.T) {
	fx := newHubFixture(t)
	code, out, errOut := runCLI(t, "--kubeconfig", fx.kubeconfig, "device", "ls", "--cluster", "gpu-east")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(out, "\n")
	if lines[0] != "Cluster gpu-east, reported 2d ago." {
		t.Errorf("first line %q", lines[0])
	}
	header, rows := tableRows(t, strings.Join(lines[1:len(lines)-2], "\n"))
	got := strings.Join(header, "|")
	for _, r := range rows {
		got += "\n" + strings.Join(r, "|")
	}
	// The L4s the cluster should have and does not report are a row of their own.
	want := "PRODUCT|GPUS|NODES|EXPECTED\nNVIDIA-H100-80GB-HBM3|16|2|16\nNVIDIA-L4|0|0|4"
	if got != want {
		t.Errorf("table\n%s\nwant\n%s", got, want)
	}
	if l := lines[len(lines)-2]; l != "Unavailable GPU nodes: 1 (not Ready or cordoned; their GPUs are not counted above)" {
		t.Errorf("last line %q", l)
	}

	code, out, errOut = runCLI(t, "--kubeconfig", fx.kubeconfig, "device", "ls", "--cluster", "gpu-east", "-o", "json")
	if code != 0 {
		t.Fatalf("-o json: exit %d: %s", code, errOut)
	}
	var inv struct {
		Cluster   string     `json:"cluster"`
		Namespace string     `json:"namespace"`
		LastSeen  *time.Time `json:"lastSeen"`
		GPUs      []struct {
			Product  string `json:"product"`
			Count    int64  `json:"count"`
			Nodes    int32  `json:"nodes"`
			Expected int32  `json:"expected"`
		} `json:"gpus"`
		UnavailableGPUNodes int32 `json:"unavailableGPUNodes"`
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&inv); err != nil {
		t.Fatalf("-o json does not parse: %v\n%s", err, out)
	}
	if inv.Cluster != "gpu-east" || inv.Namespace != fx.acme || inv.LastSeen == nil || inv.UnavailableGPUNodes != 1 || len(inv.GPUs) != 2 ||
		inv.GPUs[0].Product != "NVIDIA-H100-80GB-HBM3" || inv.GPUs[0].Count != 16 || inv.GPUs[0].Nodes != 2 || inv.GPUs[1].Expected != 4 {
		t.Errorf("inventory %+v", inv)
	}

	code, out, _ = runCLI(t, "--kubeconfig", fx.kubeconfig, "-n", fx.beta, "device", "ls", "--cluster", "tpu-lab")
	if code != 0 || out != "Cluster tpu-lab has never been seen by the hub; no GPUs reported.\nUnavailable GPU nodes: 0\n" {
		t.Errorf("a cluster never seen: exit %d, %q", code, out)
	}
}

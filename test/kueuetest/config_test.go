package kueuetest

import (
	"slices"
	"strings"
	"testing"

	configv1alpha1 "k8s.io/component-base/config/v1alpha1"
	"k8s.io/utils/ptr"
	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
)

func TestManagerArgsLeaveTheHarnessItsFlagsAndTheVisibilityServerOff(t *testing.T) {
	for _, tc := range []struct {
		name      string
		in, want  []string
		gates     map[string]bool
		wantError string
	}{
		{
			name: "a chart's arguments keep all but the config file",
			in:   []string{"--config=/controller_manager_config.yaml", "--zap-log-level=2"},
			want: []string{"--zap-log-level=2"},
		},
		{
			name:  "feature gates on the command line turn the visibility server off there",
			in:    []string{"--feature-gates=TopologyAwareScheduling=true"},
			want:  []string{"--feature-gates=TopologyAwareScheduling=true,VisibilityOnDemand=false"},
			gates: map[string]bool{"TopologyAwareScheduling": true, visibilityGate: false},
		},
		{
			name:  "a visibility gate that is set stays as set",
			in:    []string{"--feature-gates=VisibilityOnDemand=true"},
			want:  []string{"--feature-gates=VisibilityOnDemand=true"},
			gates: map[string]bool{visibilityGate: true},
		},
		{
			name:      "a harness flag with its value apart is refused",
			in:        []string{"--kubeconfig", "/root/.kube/config"},
			wantError: "give the harness's flags as --name=value",
		},
		{
			name:      "a malformed gate is refused",
			in:        []string{"--feature-gates=VisibilityOnDemand"},
			wantError: "is not name=true|false",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, gates, err := managerArgs(tc.in)
			if tc.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantError) {
					t.Fatalf("error %v, want one that says %q", err, tc.wantError)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("args %q, want %q", got, tc.want)
			}
			if len(gates) != len(tc.gates) {
				t.Errorf("gates %v, want %v", gates, tc.gates)
			}
			for k, v := range tc.gates {
				if on, ok := gates[k]; !ok || on != v {
					t.Errorf("gates %v, want %v", gates, tc.gates)
				}
			}
		})
	}
}

func TestConfigureKeepsLeaderElectionOnlyWhenAskedWithItsLeaseInTheNamespace(t *testing.T) {
	chart := &configapi.Configuration{}
	elect := &configapi.Configuration{}
	elect.LeaderElection = &configv1alpha1.LeaderElectionConfiguration{LeaderElect: ptr.To(true), ResourceName: "c1f6bfd2.kueue.x-k8s.io"}
	for _, tc := range []struct {
		name          string
		in            *configapi.Configuration
		keep          bool
		wantElect     bool
		wantNamespace string
	}{
		{name: "off by default", in: elect, wantElect: false},
		{name: "kept when asked, with the lease beside the manager", in: elect, keep: true, wantElect: true, wantNamespace: Namespace},
		{name: "not turned on when the configuration has none", in: chart, keep: true, wantElect: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := configure(tc.in, []int{1, 2, 3}, "/certs", settings{leaderElection: tc.keep})
			le := cfg.LeaderElection
			if got := ptr.Deref(le.LeaderElect, false); got != tc.wantElect {
				t.Errorf("leaderElect = %t, want %t", got, tc.wantElect)
			}
			if tc.wantElect && le.ResourceNamespace != tc.wantNamespace {
				t.Errorf("lease namespace %q, want %q", le.ResourceNamespace, tc.wantNamespace)
			}
		})
	}
}

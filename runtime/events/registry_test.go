package events

import (
	"strings"
	"testing"
)

// withEmptyRegistry runs the test against an empty process-wide registry and
// restores the previous contents afterwards.
func withEmptyRegistry(t *testing.T) {
	t.Helper()
	registry.Lock()
	saved := registry.byType
	registry.byType = map[string]*Descriptor{}
	registry.Unlock()
	t.Cleanup(func() {
		registry.Lock()
		registry.byType = saved
		registry.Unlock()
	})
}

func TestRegisterTopicRules(t *testing.T) {
	tests := []struct {
		name    string
		ds      []*Descriptor
		wantErr string // substring; "" means success
	}{
		{
			name: "distinct topics and default DLQs",
			ds: []*Descriptor{
				{Type: "d.v1.A", Topic: "d.a"},
				{Type: "d.v1.B", Topic: "d.b"},
			},
		},
		{
			name: "shared explicit DLQ topic is allowed",
			ds: []*Descriptor{
				{Type: "d.v1.A", Topic: "d.a", DLQTopic: "d.dead-letters"},
				{Type: "d.v1.B", Topic: "d.b", DLQTopic: "d.dead-letters"},
			},
		},
		{
			name: "same descriptor twice is allowed",
			ds: func() []*Descriptor {
				a := &Descriptor{Type: "d.v1.A", Topic: "d.a"}
				return []*Descriptor{a, a}
			}(),
		},
		{
			name: "topic shared",
			ds: []*Descriptor{
				{Type: "d.v1.A", Topic: "d.a"},
				{Type: "d.v1.B", Topic: "d.a"},
			},
			wantErr: `topic "d.a" used by both d.v1.A and d.v1.B`,
		},
		{
			name: "explicit DLQ is an earlier event's topic",
			ds: []*Descriptor{
				{Type: "d.v1.A", Topic: "d.a"},
				{Type: "d.v1.C", Topic: "d.c", DLQTopic: "d.a"},
			},
			wantErr: `dead-letter topic "d.a" of d.v1.C is the topic of d.v1.A`,
		},
		{
			name: "topic is an earlier event's default DLQ",
			ds: []*Descriptor{
				{Type: "d.v1.A", Topic: "d.a"},
				{Type: "d.v1.B", Topic: "d.a.dlq"},
			},
			wantErr: `topic "d.a.dlq" of d.v1.B is the dead-letter topic of d.v1.A`,
		},
		{
			name: "default DLQ is an earlier event's topic",
			ds: []*Descriptor{
				{Type: "d.v1.B", Topic: "d.a.dlq"},
				{Type: "d.v1.A", Topic: "d.a"},
			},
			wantErr: `dead-letter topic "d.a.dlq" of d.v1.A is the topic of d.v1.B`,
		},
		{
			name: "DLQ is its own topic",
			ds: []*Descriptor{
				{Type: "d.v1.A", Topic: "d.a", DLQTopic: "d.a"},
			},
			wantErr: `dead-letter topic "d.a" of d.v1.A is its own topic`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			withEmptyRegistry(t)
			err := Register(tt.ds...)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Register: %v", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("Register succeeded; want error containing %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("Register: %v; want error containing %q", err, tt.wantErr)
			}
			if tt.wantErr != "" {
				last := tt.ds[len(tt.ds)-1]
				if got, ok := Lookup(last.Type); ok && got == last {
					t.Errorf("%s was registered despite the error", last.Type)
				}
			}
		})
	}
}

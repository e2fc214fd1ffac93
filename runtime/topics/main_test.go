package topics_test

import (
	"testing"

	"github.com/protoevents/protoevents/eventstest/servers"
)

func TestMain(m *testing.M) { servers.Main(m) }

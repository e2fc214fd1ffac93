package gen

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/gofeaturespb"
)

// maxTopicLen is Kafka's limit on topic names.
const maxTopicLen = 249

// topicChars are the characters Kafka allows in a topic name.
var topicChars = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)

// dlqSuffix is appended to the topic when an event sets no dlq_topic.
const dlqSuffix = ".dlq"

// buildModel reads the event options of every file in the request, validates
// them all and returns the model of the files to generate. It returns every
// problem found, not only the first, so one run shows the whole list.
func buildModel(p *protogen.Plugin) ([]*file, error) {
	var errs errorList

	// Every event of the request, in request order: files to generate and
	// their imports alike, since topics and supersedes span packages.
	var all []*event
	byName := map[protoreflect.FullName]*protogen.Message{}
	eventByName := map[protoreflect.FullName]*event{}
	var files []*file
	for _, f := range p.Files {
		fopts, err := fileOptions(f)
		if err != nil {
			return nil, fmt.Errorf("%s: read (events.v1.file) option: %w", f.Desc.Path(), err)
		}
		producer := fopts.GetProducer()
		if producer == "" {
			producer = string(f.Desc.Package())
		}
		mf := &file{proto: f}
		var walkErr error
		walkMessages(f.Messages, func(m *protogen.Message) {
			byName[m.Desc.FullName()] = m
			opts, ok, err := eventOptions(m)
			if err != nil && walkErr == nil {
				walkErr = fmt.Errorf("%s: read (events.v1.event) option: %w", m.Desc.FullName(), err)
			}
			if !ok {
				return
			}
			ev := &event{msg: m, file: f, opts: opts, generate: f.Generate, producer: producer, names: namesFor(m)}
			all = append(all, ev)
			eventByName[m.Desc.FullName()] = ev
			mf.events = append(mf.events, ev)
		})
		if walkErr != nil {
			return nil, walkErr
		}
		if f.Generate && len(mf.events) > 0 {
			files = append(files, mf)
		}
	}

	for _, ev := range all {
		if ev.generate {
			validateEvent(&errs, ev, byName, eventByName)
		}
	}
	checkSupersedesCycles(&errs, all, eventByName)
	checkTopicClashes(&errs, all)
	checkDLQClashes(&errs, all)
	checkKafkaNameCollisions(&errs, all)
	checkNameClashes(&errs, p, files)
	if err := errs.err(); err != nil {
		return nil, err
	}
	return files, nil
}

// validateEvent checks one event's options and resolves its key path,
// DLQ topic and superseded event.
func validateEvent(errs *errorList, ev *event, byName map[protoreflect.FullName]*protogen.Message, eventByName map[protoreflect.FullName]*event) {
	m, o := ev.msg, ev.opts

	switch topic := o.GetTopic(); {
	case topic == "":
		errs.add(m, "topic is required", `set topic to the Kafka topic of the event, e.g. topic: "`+suggestTopic(m)+`"`)
	default:
		if problem := checkTopic(topic); problem != "" {
			errs.add(m, fmt.Sprintf("topic %s is not a valid Kafka topic name: %s", quoteTopic(topic), problem),
				"use 1-249 characters from [a-zA-Z0-9._-], e.g. \""+suggestTopic(m)+"\"")
		}
	}

	ev.dlqTopic = o.GetDlqTopic()
	switch {
	case ev.dlqTopic != "":
		if problem := checkTopic(ev.dlqTopic); problem != "" {
			errs.add(m, fmt.Sprintf("dlq_topic %s is not a valid Kafka topic name: %s", quoteTopic(ev.dlqTopic), problem),
				"use 1-249 characters from [a-zA-Z0-9._-], or leave dlq_topic unset for \"<topic>.dlq\"")
		} else if ev.dlqTopic == o.GetTopic() {
			errs.add(m, fmt.Sprintf("dlq_topic %q is the event's own topic", ev.dlqTopic),
				"give the dead-letter queue its own topic, or leave dlq_topic unset for \"<topic>.dlq\"")
		}
	case o.GetTopic() != "":
		ev.dlqTopic = o.GetTopic() + dlqSuffix
		if checkTopic(o.GetTopic()) == "" && len(ev.dlqTopic) > maxTopicLen {
			errs.add(m, fmt.Sprintf("the default dlq_topic %s is longer than %d characters", quoteTopic(ev.dlqTopic), maxTopicLen),
				"shorten topic, or set a shorter dlq_topic")
		}
	}

	if o.GetVersion() == 0 {
		errs.add(m, "version is required", "set version: 1 for a new event, and bump it, on a new topic, for each breaking change")
	}

	ev.keyPath = resolveKey(errs, m, o.GetKey())

	if s := o.GetSupersedes(); s != "" {
		name := protoreflect.FullName(strings.TrimPrefix(s, "."))
		target, isMsg := byName[name]
		switch {
		case name == m.Desc.FullName():
			errs.add(m, fmt.Sprintf("supersedes %q names the event itself", s),
				"name the older event this one replaces, e.g. supersedes: \"pkg.v1."+string(m.Desc.Name())+"\", or drop supersedes")
		case !isMsg:
			errs.add(m, fmt.Sprintf("supersedes %q names no message known to this generation run", s),
				"use the full name (package.Message) of the older event, and generate or import its .proto file together with this one")
		case eventByName[name] == nil:
			errs.add(m, fmt.Sprintf("supersedes %q names a message that is not an event (declared at %s)", s, where(target)),
				"name a message that has the (events.v1.event) option")
		default:
			old := eventByName[name]
			ev.supersedes = old
			if ov, nv := old.opts.GetVersion(), o.GetVersion(); ov != 0 && nv != 0 && nv <= ov {
				errs.add(m, fmt.Sprintf("supersedes %q, which is at version %d (declared at %s), but this event is at version %d",
					s, ov, where(target), nv),
					fmt.Sprintf("the superseding event must have the higher version: set version to %d or more here, or let %s supersede this event instead", ov+1, name))
			}
		}
	}
}

// checkSupersedesCycles reports events whose supersedes chain leads back to
// themselves (A supersedes B supersedes A, of any length): there is no oldest
// event to migrate from, and the generated packages would import each other.
// Each generated event on the cycle gets an error; events whose chain only
// runs into a cycle are left to the cycle's own errors. Supersedes naming the
// event itself is reported by validateEvent.
func checkSupersedesCycles(errs *errorList, all []*event, eventByName map[protoreflect.FullName]*event) {
	next := func(ev *event) *event {
		name := protoreflect.FullName(strings.TrimPrefix(ev.opts.GetSupersedes(), "."))
		if name == "" || name == ev.msg.Desc.FullName() {
			return nil
		}
		return eventByName[name]
	}
	for _, ev := range all {
		if !ev.generate {
			continue
		}
		path := []string{string(ev.msg.Desc.FullName())}
		seen := map[*event]bool{ev: true}
		for cur := next(ev); cur != nil; cur = next(cur) {
			path = append(path, string(cur.msg.Desc.FullName()))
			if cur == ev {
				errs.add(ev.msg, fmt.Sprintf("supersedes %q makes a cycle: %s", ev.opts.GetSupersedes(), strings.Join(path, " supersedes ")),
					"supersedes must point from a newer event to an older one; drop supersedes from the oldest event (the lowest version)")
				break
			}
			if seen[cur] {
				break // a cycle that ev only leads into
			}
			seen[cur] = true
		}
	}
}

// checkTopic returns why topic is not a valid Kafka topic name, or "".
func checkTopic(topic string) string {
	switch {
	case topic == "":
		return "it is empty"
	case len(topic) > maxTopicLen:
		return fmt.Sprintf("it is longer than %d characters", maxTopicLen)
	case topic == "." || topic == "..":
		return `"." and ".." are reserved`
	case !topicChars.MatchString(topic):
		var bad []string
		seen := map[rune]bool{}
		for _, r := range topic {
			if !seen[r] && !topicChars.MatchString(string(r)) {
				seen[r] = true
				bad = append(bad, fmt.Sprintf("%q", r))
			}
		}
		return "it contains " + strings.Join(bad, ", ")
	}
	return ""
}

// quoteTopic quotes a topic for an error message, eliding the middle of
// names too long to read.
func quoteTopic(topic string) string {
	const keep = 24
	if len(topic) <= 2*keep+8 {
		return fmt.Sprintf("%q", topic)
	}
	return fmt.Sprintf("%q (%d characters)", topic[:keep]+"..."+topic[len(topic)-keep:], len(topic))
}

// suggestTopic proposes a topic name for m in the documented style.
func suggestTopic(m *protogen.Message) string {
	pkg := string(m.Desc.ParentFile().Package())
	name := kebab(string(m.Desc.Name()))
	if pkg == "" {
		return name + ".v1"
	}
	parts := strings.Split(pkg, ".")
	return parts[0] + "." + name + ".v1"
}

// kebab turns OrderPlaced into order-placed and DLQRetried into
// dlq-retried.
func kebab(s string) string {
	rs := []rune(s)
	isUpper := func(i int) bool { return i >= 0 && i < len(rs) && unicode.IsUpper(rs[i]) }
	var b strings.Builder
	for i, r := range rs {
		switch {
		case r == '_':
			b.WriteByte('-')
			continue
		case isUpper(i) && i > 0 && rs[i-1] != '_' && (!isUpper(i-1) || (i+1 < len(rs) && !isUpper(i+1) && rs[i+1] != '_')):
			b.WriteByte('-')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// resolveKey follows the dot-separated key path from m and returns its
// fields, outermost first, or nil after recording what is wrong.
func resolveKey(errs *errorList, m *protogen.Message, key string) []*protogen.Field {
	if key == "" {
		errs.add(m, "key is required", "set key to the field whose value orders the event, e.g. key: \""+suggestKey(m)+"\"")
		return nil
	}
	var fields []*protogen.Field
	cur := m
	segs := strings.Split(key, ".")
	for i, seg := range segs {
		var fld *protogen.Field
		for _, f := range cur.Fields {
			if string(f.Desc.Name()) == seg {
				fld = f
				break
			}
		}
		if fld == nil {
			errs.add(m, fmt.Sprintf("key %q: %s has no field %q (valid fields: %s)", key, cur.Desc.FullName(), seg, fieldList(cur)),
				"name a field of "+string(cur.Desc.FullName())+" in key, with the field name used in the .proto file")
			return nil
		}
		fields = append(fields, fld)
		last := i == len(segs)-1
		if problem, fix := keyFieldProblem(fld, last); problem != "" {
			errs.add(m, fmt.Sprintf("key %q: field %s %s", key, fld.Desc.FullName(), problem), fix)
			return nil
		}
		cur = fld.Message
	}
	return fields
}

// keyFieldProblem says why fld cannot be a step (last=false) or the end
// (last=true) of a key path, and how to fix it; "" when it can.
func keyFieldProblem(fld *protogen.Field, last bool) (problem, fix string) {
	d := fld.Desc
	const scalarFix = "key on a singular string, bytes or integer field, e.g. an ID"
	switch {
	case d.ContainingOneof() != nil && !d.ContainingOneof().IsSynthetic():
		return fmt.Sprintf("is a member of oneof %s: whenever another member is set it is empty and the event has no key", d.ContainingOneof().Name()),
			"key on a field outside the oneof that every event of this type sets, e.g. an ID"
	case d.IsMap():
		return "is a map, which has no single key value", scalarFix
	case d.IsList():
		return "is repeated, which has no single key value", scalarFix + "; a repeated field cannot be part of the path"
	case !last && d.Message() == nil:
		return fmt.Sprintf("is of type %s, not a message, so the key path cannot go on past it", kindName(d)),
			"end the key path at " + string(d.Name()) + ", or step only through message fields"
	case !last:
		return "", ""
	}
	switch d.Kind() {
	case protoreflect.StringKind, protoreflect.BytesKind,
		protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint32Kind, protoreflect.Fixed32Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return "", ""
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return "is a message, which has no canonical key form",
			"name a string, bytes or integer field inside it, e.g. key: \"" + string(d.Name()) + "." + suggestKey(fld.Message) + "\""
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return "is a " + kindName(d) + ", whose text form is not a stable key", scalarFix
	case protoreflect.BoolKind:
		return "is a bool, which would put every event in one of two partitions", scalarFix
	case protoreflect.EnumKind:
		return "is an enum, whose values can be renamed or renumbered", scalarFix
	}
	return "is of type " + kindName(d) + ", which is not supported as a key", scalarFix
}

// kindName names the type of d as written in a .proto file.
func kindName(d protoreflect.FieldDescriptor) string {
	switch d.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return string(d.Message().FullName())
	case protoreflect.EnumKind:
		return string(d.Enum().FullName())
	}
	return d.Kind().String()
}

// fieldList lists the field names of m in declaration order.
func fieldList(m *protogen.Message) string {
	if len(m.Fields) == 0 {
		return "none"
	}
	names := make([]string, len(m.Fields))
	for i, f := range m.Fields {
		names[i] = string(f.Desc.Name())
	}
	return strings.Join(names, ", ")
}

// suggestKey proposes a key for m: its first field that could be one.
func suggestKey(m *protogen.Message) string {
	for _, f := range m.Fields {
		if p, _ := keyFieldProblem(f, true); p == "" {
			return string(f.Desc.Name())
		}
	}
	return "id"
}

// checkTopicClashes reports events sharing a topic. A topic carries one
// event type at one version: consumers decode a topic's messages as one type,
// and the runtime registry refuses a second event on a topic. Events only
// imported by the request count as the other side of a clash but get no
// error of their own.
func checkTopicClashes(errs *errorList, all []*event) {
	byTopic := map[string][]*event{}
	var order []string
	for _, ev := range all {
		if ev.opts.GetTopic() == "" || ev.opts.GetVersion() == 0 {
			continue
		}
		t := ev.opts.GetTopic()
		if byTopic[t] == nil {
			order = append(order, t)
		}
		byTopic[t] = append(byTopic[t], ev)
	}
	for _, topic := range order {
		evs := byTopic[topic]
		if len(evs) < 2 {
			continue
		}
		for _, ev := range evs {
			if !ev.generate {
				continue
			}
			var same, other []string
			for _, o := range evs {
				if o == ev {
					continue
				}
				desc := fmt.Sprintf("%s (%s)", o.msg.Desc.FullName(), where(o.msg))
				if o.opts.GetVersion() == ev.opts.GetVersion() {
					same = append(same, desc)
				} else {
					other = append(other, fmt.Sprintf("%s at version %d", desc, o.opts.GetVersion()))
				}
			}
			if len(same) > 0 {
				errs.add(ev.msg, fmt.Sprintf("topic %q at version %d is also used by %s", topic, ev.opts.GetVersion(), strings.Join(same, ", ")),
					"give each event its own topic; consumers decode a topic's messages as one event type")
			}
			if len(other) > 0 {
				errs.add(ev.msg, fmt.Sprintf("topic %q is also used by %s", topic, strings.Join(other, ", ")),
					"publish each version on its own topic (e.g. ending in .v2) and mark the new one supersedes the old")
			}
		}
	}
}

// effectiveDLQ is the dead-letter topic of ev: dlq_topic, or "<topic>.dlq"
// when it is unset. validateEvent resolves it only for events being
// generated, so imported events get it computed here.
func effectiveDLQ(ev *event) string {
	if ev.dlqTopic != "" {
		return ev.dlqTopic
	}
	if d := ev.opts.GetDlqTopic(); d != "" {
		return d
	}
	return ev.opts.GetTopic() + dlqSuffix
}

// checkDLQClashes reports dead-letter topics that are another event's topic:
// consumers of that topic would decode the dead letters as events of their
// own type. Both sides get an error when generated. Several events sharing
// one dead-letter topic is fine (e.g. one "orders.dead-letters"), and a DLQ
// equal to the event's own topic is reported by validateEvent.
func checkDLQClashes(errs *errorList, all []*event) {
	byTopic := map[string][]*event{}
	for _, ev := range all {
		if ev.opts.GetTopic() == "" || ev.opts.GetVersion() == 0 {
			continue
		}
		byTopic[ev.opts.GetTopic()] = append(byTopic[ev.opts.GetTopic()], ev)
	}
	for _, ev := range all {
		if ev.opts.GetTopic() == "" || ev.opts.GetVersion() == 0 {
			continue
		}
		dlq := effectiveDLQ(ev)
		kind := "dlq_topic"
		if ev.opts.GetDlqTopic() == "" {
			kind = "the default dlq_topic"
		}
		for _, o := range byTopic[dlq] {
			if o == ev {
				continue
			}
			if ev.generate {
				errs.add(ev.msg, fmt.Sprintf("%s %q is the topic of event %s (%s)", kind, dlq, o.msg.Desc.FullName(), where(o.msg)),
					"give the dead-letter queue a topic no event is published to; consumers of "+strconv.Quote(dlq)+" would read dead letters as "+string(o.msg.Desc.FullName()))
			}
			if o.generate {
				errs.add(o.msg, fmt.Sprintf("topic %q is also the dead-letter topic of event %s (%s)", dlq, ev.msg.Desc.FullName(), where(ev.msg)),
					"publish the event to a topic that is no event's dead-letter queue, or change "+string(ev.msg.Desc.FullName())+"'s dlq_topic")
			}
		}
	}
}

// checkKafkaNameCollisions reports topics that differ only in '.' versus
// '_': Kafka maps both to '_' in its metric names and refuses to create the
// second of two such topics, so the second event could never be published.
// Event topics and effective DLQ topics both count.
func checkKafkaNameCollisions(errs *errorList, all []*event) {
	type use struct {
		topic string
		ev    *event
	}
	byFolded := map[string][]use{}
	for _, ev := range all {
		if ev.opts.GetTopic() == "" || ev.opts.GetVersion() == 0 {
			continue
		}
		for _, t := range []string{ev.opts.GetTopic(), effectiveDLQ(ev)} {
			f := strings.ReplaceAll(t, ".", "_")
			byFolded[f] = append(byFolded[f], use{t, ev})
		}
	}
	for _, uses := range byFolded {
		for _, u := range uses {
			if !u.ev.generate {
				continue
			}
			for _, o := range uses {
				if o.topic == u.topic {
					continue
				}
				errs.add(u.ev.msg, fmt.Sprintf("topic %q collides in Kafka with %q of %s (%s): names that differ only in '.' and '_' cannot coexist", u.topic, o.topic, o.ev.msg.Desc.FullName(), where(o.ev.msg)),
					"rename one of them so they differ in more than '.' versus '_'")
				break
			}
		}
	}
}

// checkNameClashes assigns registry names and reports generated Go names
// that would collide with what protoc-gen-go declares in the same package.
func checkNameClashes(errs *errorList, p *protogen.Plugin, files []*file) {
	byPkg := map[protogen.GoImportPath][]*protogen.File{}
	for _, f := range p.Files {
		byPkg[f.GoImportPath] = append(byPkg[f.GoImportPath], f)
	}
	taken := map[protogen.GoImportPath]map[string]string{}
	for _, mf := range files {
		pkg := mf.proto.GoImportPath
		if taken[pkg] == nil {
			taken[pkg] = packageIdents(byPkg[pkg])
		}
		idents := taken[pkg]
		for _, ev := range mf.events {
			what := "the code generated for event " + string(ev.msg.Desc.FullName())
			for _, n := range ev.names.list() {
				if other, ok := idents[n]; ok {
					errs.add(ev.msg, fmt.Sprintf("generated Go name %s clashes with %s", n, other),
						"rename one of them; the events layer declares "+n+" for this event")
					continue
				}
				idents[n] = what
			}
			if mf.proto.APILevel != gofeaturespb.GoFeatures_API_OPAQUE {
				fields := goFieldNames(ev.msg)
				for _, method := range generatedMethods {
					if other, ok := fields[method]; ok {
						errs.add(ev.msg, fmt.Sprintf("%s has Go field %s, which clashes with the generated method %s", other, method, method),
							"rename the "+other+"; every event message gets the methods EventKey and EventDescriptor")
					}
				}
			}
		}
		// Registry variable: <Base>Events, or <Base>ProtoEvents when a
		// message or another file of the package already has that name.
		primary := registryName(mf.proto.Desc.Path())
		fallback := strings.TrimSuffix(primary, "Events") + "ProtoEvents"
		switch {
		case idents[primary] == "":
			mf.registry = primary
		case idents[fallback] == "":
			mf.registry = fallback
		default:
			errs.add(mf.events[0].msg, fmt.Sprintf("the file's registry variable would be %s or %s, but they are taken by %s and %s",
				primary, fallback, idents[primary], idents[fallback]),
				"rename the clashing declarations or the .proto file")
			continue
		}
		idents[mf.registry] = "the registry of " + mf.proto.Desc.Path()
	}
}

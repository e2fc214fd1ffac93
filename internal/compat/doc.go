// Package compat keeps event schemas compatible with their readers. It
// snapshots every event's contract (topic, key, version and the transitive
// schema of its message) into a Lock, compares a new Lock against an old one
// and reports each breaking change as a Finding naming the file, the
// message/field and the remedy: almost always "publish a new version on a new
// topic that supersedes the old event, and keep the old one".
//
// Snapshot, ParseLock, Lock.Marshal and Compare are pure. The I/O lives in
// three explicit entry points: CheckGeneration (run by protoc-gen-events
// with lock=<path>: fails generation on breaking changes, else emits the
// updated lock), RunCLI (`protoc-gen-events compat --against <baseline>`, for
// CI) and FilesFromImage (decodes buf images and FileDescriptorSets).
//
// The rules, the decisions behind them and how they differ from buf breaking
// are documented in docs/compat.md and docs/compat-vs-buf.md.
package compat

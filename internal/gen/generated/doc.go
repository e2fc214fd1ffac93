// Package generated tests the behaviour of the code protoc-gen-events
// generates, by exercising the committed golden output in testdata/golden
// (the generator's own tests check that output is current). It is a
// separate package so that the generator's tests, and their -update flag,
// still build when the golden output does not.
package generated

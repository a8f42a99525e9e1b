// Package shdoc runs a document's shell block as a user runs it: the commands of a ```sh
// block, pasted one at a time into one bash, so that variables, exports, the working
// directory and background jobs carry from one command to the next. Tests use it to run
// docs' command blocks as written (docs/deploy.md's harness block), so that the docs
// cannot drift from what works.
package shdoc

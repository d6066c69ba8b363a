package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeSnippet fails when a line of the README's Go snippet is not a line of
// roomstate's Example, in the same order: the snippet is an excerpt of a program
// that go test compiles and runs, so it stays one. A "// ..." line stands for the
// lines left out.
func TestReadmeSnippet(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) != 1 {
		t.Fatalf("README.md has %d Go blocks, want the one library snippet", len(blocks))
	}
	src, err := os.ReadFile(filepath.Join("..", "roomstate", "example_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(src), "\nfunc Example() {\n")
	if !ok {
		t.Fatal("roomstate/example_test.go has no func Example")
	}
	body, _, _ = strings.Cut(body, "\n}\n")
	example := strings.Split(body, "\n")
	at := 0
	for _, line := range strings.Split(blocks[0][1], "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line == "// ..." {
			continue
		}
		for at < len(example) && strings.TrimSpace(example[at]) != line {
			at++
		}
		if at == len(example) {
			t.Fatalf("README.md's snippet line %q is not a line of roomstate's Example after the lines before it", line)
		}
		at++
	}
}

// mdLink matches the target of a Markdown link or image: ](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinks fails when a relative link in README.md, CHANGELOG.md or a page under
// docs/ names a file or directory that does not exist.
func TestLinks(t *testing.T) {
	pages := []string{filepath.Join("..", "README.md"), filepath.Join("..", "CHANGELOG.md")}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			pages = append(pages, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	links := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			links++
			if _, err := os.Stat(filepath.Join(filepath.Dir(page), target)); err != nil {
				t.Errorf("%s: link to %s: %v", page, m[1], err)
			}
		}
	}
	if links < 20 {
		t.Errorf("%d relative links found in %d pages: the pattern no longer matches", links, len(pages))
	}
}

package books

import "testing"

func TestValidISBN(t *testing.T) {
	for _, tc := range []struct {
		isbn string
		ok   bool
	}{
		{"0-306-40615-2", true},
		{"0306406152", true},
		{"080442957X", true},
		{"978-0-306-40615-7", true},
		{"9780306406157", true},
		{"0-306-40615-3", false},
		{"9780306406158", false},
		{"12345", false},
		{"97803064061X7", false},
	} {
		if err := validISBN(tc.isbn); (err == nil) != tc.ok {
			t.Errorf("validISBN(%q) = %v, want ok=%v", tc.isbn, err, tc.ok)
		}
	}
}

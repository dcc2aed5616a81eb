import Testing

@testable import CofferModel

@Suite struct TextMergeTests {
    func merge(_ b: String, _ l: String, _ r: String) -> (String, Bool) {
        let res = TextMerge.merge(base: Array(b.utf8), local: Array(l.utf8), remote: Array(r.utf8))
        return (String(decoding: res.merged, as: UTF8.self), res.hasConflicts)
    }

    @Test func nonOverlappingEditsMergeCleanly() {
        let base = "a\nb\nc\nd\ne\nf\ng\n"
        let (m, c) = merge(base, "A\nb\nc\nd\ne\nf\ng\n", "a\nb\nc\nd\ne\nf\nG\n")
        #expect(m == "A\nb\nc\nd\ne\nf\nG\n")
        #expect(!c)
    }

    @Test func insertionsAndDeletionsOnBothSides() {
        let base = "one\ntwo\nthree\nfour\nfive\n"
        let (m, c) = merge(base, "zero\none\ntwo\nthree\nfour\nfive\n", "one\ntwo\nfour\nfive\nsix\n")
        #expect(m == "zero\none\ntwo\nfour\nfive\nsix\n")
        #expect(!c)
    }

    @Test func sameChangeOnBothSidesIsNotAConflict() {
        let (m, c) = merge("x\ny\nz\n", "x\nY\nz\n", "x\nY\nz\n")
        #expect(m == "x\nY\nz\n" && !c)
    }

    @Test func overlappingEditsKeepBothSidesBetweenMarkers() {
        let (m, c) = merge("a\nb\nc\n", "a\nlocal\nc\n", "a\nremote\nc\n")
        #expect(c)
        #expect(m == "a\n<<<<<<< local\nlocal\n=======\nremote\n>>>>>>> remote\nc\n")
    }

    @Test func conflictWithoutTrailingNewline() {
        let (m, c) = merge("a", "b", "c")
        #expect(c)
        #expect(m == "<<<<<<< local\nb\n=======\nc\n>>>>>>> remote\n")
    }

    @Test func oneSideUnchangedTakesTheOther() {
        #expect(merge("a\n", "a\n", "b\n").0 == "b\n")
        #expect(merge("a\n", "b\n", "a\n").0 == "b\n")
        #expect(merge("", "new\n", "").0 == "new\n")
    }

    @Test func bothAppendDifferentLinesConflict() {
        let (m, c) = merge("a\n", "a\nL\n", "a\nR\n")
        #expect(c)
        #expect(m.hasPrefix("a\n<<<<<<< local\nL\n=======\nR\n>>>>>>> remote\n"))
    }

    @Test func largeRandomisedEditsNeverLoseLines() {
        // Each side edits disjoint regions of a long file; the merge must contain every edit.
        var rng = UInt64(42)
        func next() -> UInt64 {
            rng ^= rng << 13
            rng ^= rng >> 7
            rng ^= rng << 17
            return rng
        }
        let base = (0..<2000).map { "line \($0)\n" }
        var local = base
        var remote = base
        for i in stride(from: 0, to: 1000, by: 37) { local[i] = "local edit \(next() % 1000)\n" }
        for i in stride(from: 1010, to: 2000, by: 41) { remote[i] = "remote edit \(next() % 1000)\n" }
        local.insert("inserted locally\n", at: 500)
        remote.remove(at: 1500)
        let (m, c) = merge(base.joined(), local.joined(), remote.joined())
        #expect(!c)
        var expected = base
        for i in stride(from: 0, to: 1000, by: 37) { expected[i] = local[i > 500 ? i + 1 : i] }
        for i in stride(from: 1010, to: 2000, by: 41) where i != 1500 { expected[i] = remote[i > 1500 ? i - 1 : i] }
        expected.remove(at: 1500)
        expected.insert("inserted locally\n", at: 500)
        #expect(m == expected.joined())
    }

    @Test func textDetection() {
        #expect(TextMerge.isText(Array("hello\n".utf8)))
        #expect(!TextMerge.isText([0x66, 0x00, 0x67]))
        #expect(!TextMerge.isText([0xff, 0xfe]))
    }
}

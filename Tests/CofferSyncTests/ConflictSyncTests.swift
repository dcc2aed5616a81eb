import CofferTestSupport
import CofferVault
import Foundation
import Testing

/// Concurrent changes on two devices, merged by the rules of the design: remote (first to
/// sync) wins name and parent, deletion wins, cycles undone, path conflicts renamed, content
/// conflicts merged or copied. Nothing a user wrote is lost.
@Suite(.serialized) struct ConflictSyncTests {
    /// A world with a synced starting tree.
    func world(_ setup: (Device) throws -> Void) async throws -> SyncWorld {
        let w = try await SyncWorld()
        try setup(w.a)
        try await w.sync(w.a, w.b)
        return w
    }

    // MARK: Renames and moves

    @Test func concurrentRenamesFirstSyncWins() async throws {
        let w = try await world { try $0.write("/f.txt", "f") }
        try w.a.mv("/f.txt", "/from-a.txt")
        try w.b.mv("/f.txt", "/from-b.txt")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.b.ls() == ["from-a.txt"])
        try await w.expectConverged()
    }

    @Test func concurrentMovesFirstSyncWins() async throws {
        let w = try await world { d in
            try d.mkdir("/x")
            try d.mkdir("/y")
            try d.write("/f.txt", "f")
        }
        try w.a.mv("/f.txt", "/x/f.txt")
        try w.b.mv("/f.txt", "/y/f.txt")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(w.b.exists("/x/f.txt") && !w.b.exists("/y/f.txt"))
        try await w.expectConverged()
    }

    @Test func renameAgainstMoveRemoteWinsBoth() async throws {
        let w = try await world { d in
            try d.mkdir("/x")
            try d.write("/f.txt", "f")
        }
        try w.a.mv("/f.txt", "/g.txt")
        try w.b.mv("/f.txt", "/x/f.txt")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(w.b.exists("/g.txt") && !w.b.exists("/x/f.txt"))
        try await w.expectConverged()
    }

    @Test func moveAgainstDeleteOfTheFile() async throws {
        let w = try await world { d in
            try d.mkdir("/x")
            try d.write("/f.txt", "f")
        }
        try w.a.rm("/f.txt")
        try w.b.mv("/f.txt", "/x/f.txt")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(!w.b.exists("/x/f.txt") && !w.b.exists("/f.txt"))
        try await w.expectConverged()
    }

    @Test func moveOutOfAFolderDeletedLaterSurvives() async throws {
        let w = try await world { d in
            try d.mkdir("/dir")
            try d.write("/dir/keep.txt", "k")
        }
        try w.a.mv("/dir/keep.txt", "/keep.txt")
        try w.b.rm("/dir")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.b.read("/keep.txt") == "k")
        #expect(!w.b.exists("/dir"))
        try await w.expectConverged()
    }

    @Test func moveOutOfAFolderDeletedEarlierIsDeleted() async throws {
        let w = try await world { d in
            try d.mkdir("/dir")
            try d.write("/dir/f.txt", "f")
        }
        try w.b.rm("/dir")
        try w.a.mv("/dir/f.txt", "/f.txt")
        try await w.sync(w.b, w.a, w.b, w.a)
        // The deletion reached the server first, so the file went with its folder.
        #expect(!w.a.exists("/f.txt") && !w.a.exists("/dir"))
        try await w.expectConverged()
    }

    @Test func renameFolderWhileOtherAddsInside() async throws {
        let w = try await world { try $0.mkdir("/F") }
        try w.a.mv("/F", "/G")
        try w.b.write("/F/new.txt", "new")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.read("/G/new.txt") == "new")
        try await w.expectConverged()
    }

    @Test func moveFolderWithContents() async throws {
        let w = try await world { d in
            try d.mkdir("/p/q")
            try d.mkdir("/r")
            try d.write("/p/q/f.txt", "f")
        }
        try w.a.mv("/p", "/r/p")
        try w.b.write("/p/q/g.txt", "g")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.ls("/r/p/q") == ["f.txt", "g.txt"])
        try await w.expectConverged()
    }

    // MARK: Cycles

    @Test func twoFolderCycleIsUndone() async throws {
        let w = try await world { d in
            try d.mkdir("/X")
            try d.mkdir("/Y")
        }
        try w.a.mv("/X", "/Y/X")
        try w.b.mv("/Y", "/X/Y")
        try await w.sync(w.a, w.b, w.a, w.b)
        // A's move reached the server first; B's local move would close a loop and is undone.
        #expect(w.b.exists("/Y/X") && !w.b.exists("/X"))
        try await w.expectConverged()
    }

    @Test func threeFolderCycleIsUndone() async throws {
        let w = try await world { d in
            try d.mkdir("/X")
            try d.mkdir("/Y")
            try d.mkdir("/Z")
        }
        try w.a.mv("/X", "/Y/X")
        try w.b.mv("/Y", "/Z/Y")
        try w.b.mv("/Z", "/X/Z")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.b.ls().count >= 1)
        try await w.expectConverged()
        for name in ["X", "Y", "Z"] {
            #expect(try w.a.snapshot().keys.contains { $0.hasSuffix("/" + name) }, "\(name) lost")
        }
    }

    @Test func cycleWithContentsKeepsEverything() async throws {
        let w = try await world { d in
            try d.mkdir("/X")
            try d.mkdir("/Y")
            try d.write("/X/x.txt", "x")
            try d.write("/Y/y.txt", "y")
        }
        try w.a.mv("/Y", "/X/Y")
        try w.b.mv("/X", "/Y/X")
        try w.b.write("/Y/X/new.txt", "new")
        try await w.sync(w.a, w.b, w.a, w.b)
        let snap = try w.a.snapshot()
        #expect(
            snap.keys.contains { $0.hasSuffix("/x.txt") } && snap.keys.contains { $0.hasSuffix("/y.txt") }
                && snap.keys.contains { $0.hasSuffix("/new.txt") })
        try await w.expectConverged()
    }

    // MARK: Path conflicts

    @Test func bothCreateTheSameName() async throws {
        let w = try await SyncWorld()
        try w.a.write("/notes.txt", "from a")
        try w.b.write("/notes.txt", "from b")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.ls() == ["notes-1.txt", "notes.txt"])
        #expect(try w.a.read("/notes.txt") == "from a")
        #expect(try w.a.read("/notes-1.txt") == "from b")
        try await w.expectConverged()
    }

    @Test func bothCreateTheSameFolder() async throws {
        let w = try await SyncWorld()
        try w.a.mkdir("/docs")
        try w.a.write("/docs/a.txt", "a")
        try w.b.mkdir("/docs")
        try w.b.write("/docs/b.txt", "b")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.ls() == ["docs", "docs-1"])
        #expect(try w.a.read("/docs/a.txt") == "a" && w.a.read("/docs-1/b.txt") == "b")
        try await w.expectConverged()
    }

    @Test func renameIntoATakenName() async throws {
        let w = try await world { try $0.write("/a.txt", "a") }
        try w.a.write("/c.txt", "new c")
        try w.b.mv("/a.txt", "/c.txt")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.read("/c.txt") == "new c" && w.a.read("/c-1.txt") == "a")
        try await w.expectConverged()
    }

    @Test func moveIntoATakenName() async throws {
        let w = try await world { d in
            try d.mkdir("/x")
            try d.mkdir("/y")
            try d.write("/x/a.txt", "moved")
        }
        try w.a.write("/y/a.txt", "created")
        try w.b.mv("/x/a.txt", "/y/a.txt")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.read("/y/a.txt") == "created" && w.a.read("/y/a-1.txt") == "moved")
        try await w.expectConverged()
    }

    @Test func conflictCopyCollidesWithExistingCopy() async throws {
        let w = try await world { try $0.write("/notes-1.txt", "older copy") }
        try w.a.write("/notes.txt", "a")
        try w.b.write("/notes.txt", "b")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.ls() == ["notes-1.txt", "notes-2.txt", "notes.txt"])
        #expect(try w.a.read("/notes-2.txt") == "b" && w.a.read("/notes-1.txt") == "older copy")
        try await w.expectConverged()
    }

    @Test func namesWithoutExtensionAndDotfiles() async throws {
        let w = try await SyncWorld()
        try w.a.write("/README", "a")
        try w.a.write("/.bashrc", "a")
        try w.a.write("/archive.tar.gz", "a")
        try w.b.write("/README", "b")
        try w.b.write("/.bashrc", "b")
        try w.b.write("/archive.tar.gz", "b")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.ls() == [".bashrc", ".bashrc-1", "README", "README-1", "archive.tar-1.gz", "archive.tar.gz"])
        try await w.expectConverged()
    }

    @Test func symlinkAgainstFileOfTheSameName() async throws {
        let w = try await SyncWorld()
        try w.a.symlink("/thing", "target")
        try w.b.write("/thing", "file")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.ls() == ["thing", "thing-1"])
        try await w.expectConverged()
    }

    @Test func deleteAndRecreateAgainstEditOfTheOld() async throws {
        let w = try await world { try $0.write("/a.txt", "old") }
        try w.a.rm("/a.txt")
        try w.a.write("/a.txt", "brand new")
        try w.b.write("/a.txt", "edited old")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.read("/a.txt") == "brand new")
        #expect(try w.a.read("/a-1.txt") == "edited old")
        try await w.expectConverged()
    }

    // MARK: Deletion against edits

    @Test func deleteAgainstEditKeepsTheEdit() async throws {
        let w = try await world { try $0.write("/doc.txt", "v1") }
        try w.a.rm("/doc.txt")
        try w.b.write("/doc.txt", "v2 from b")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.read("/doc.txt") == "v2 from b")
        try await w.expectConverged()
    }

    @Test func editAgainstDeleteWhenEditSyncsFirst() async throws {
        let w = try await world { try $0.write("/doc.txt", "v1") }
        try w.b.write("/doc.txt", "v2 from b")
        try w.a.rm("/doc.txt")
        try await w.sync(w.b, w.a, w.b, w.a)
        // Deletion wins over the synced edit (no unsynced edit remains to save).
        #expect(!w.a.exists("/doc.txt"))
        try await w.expectConverged()
    }

    @Test func editInsideAFolderDeletedElsewhereLandsInTheRoot() async throws {
        let w = try await world { d in
            try d.mkdir("/proj/src")
            try d.write("/proj/src/main.c", "int main;")
        }
        try w.a.rm("/proj")
        try w.b.write("/proj/src/main.c", "int main() { return 0; }")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(!w.a.exists("/proj"))
        #expect(try w.a.read("/main.c") == "int main() { return 0; }")
        try await w.expectConverged()
    }

    @Test func newFileInAFolderDeletedElsewhereLandsInTheRoot() async throws {
        let w = try await world { try $0.mkdir("/E") }
        try w.a.rm("/E")
        try w.b.write("/E/idea.txt", "don't lose me")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.read("/idea.txt") == "don't lose me")
        try await w.expectConverged()
    }

    @Test func bothDeleteTheSameFile() async throws {
        let w = try await world { try $0.write("/x.txt", "x") }
        try w.a.rm("/x.txt")
        try w.b.rm("/x.txt")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.ls() == [])
        try await w.expectConverged()
    }

    @Test func chmodAgainstDelete() async throws {
        let w = try await world { try $0.write("/x.txt", "x") }
        try w.a.rm("/x.txt")
        try w.b.chmod("/x.txt", 0o600)
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(!w.b.exists("/x.txt"))
        try await w.expectConverged()
    }

    @Test func deleteFolderAgainstRenameInside() async throws {
        let w = try await world { d in
            try d.mkdir("/d")
            try d.write("/d/a.txt", "a")
        }
        try w.a.rm("/d")
        try w.b.mv("/d/a.txt", "/d/b.txt")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.b.ls() == [])
        try await w.expectConverged()
    }

    // MARK: Content

    @Test func cleanTextMerge() async throws {
        let base = (1...20).map { "line \($0)\n" }.joined()
        let w = try await world { try $0.write("/t.txt", base) }
        try w.a.write("/t.txt", base.replacingOccurrences(of: "line 2\n", with: "line two (a)\n"))
        try w.b.write("/t.txt", base.replacingOccurrences(of: "line 19\n", with: "line nineteen (b)\n"))
        try await w.sync(w.a, w.b, w.a, w.b)
        let merged = try w.a.read("/t.txt")
        #expect(merged.contains("line two (a)") && merged.contains("line nineteen (b)") && !merged.contains("<<<<<<<"))
        #expect(try w.a.ls() == ["t.txt"])
        try await w.expectConverged()
    }

    @Test func overlappingTextEditsKeepBothBetweenMarkers() async throws {
        let w = try await world { try $0.write("/t.txt", "a\nb\nc\n") }
        try w.a.write("/t.txt", "a\nfrom A\nc\n")
        try w.b.write("/t.txt", "a\nfrom B\nc\n")
        try await w.sync(w.a, w.b, w.a, w.b)
        let merged = try w.a.read("/t.txt")
        #expect(
            merged.contains("<<<<<<<") && merged.contains("from A") && merged.contains("from B")
                && merged.contains(">>>>>>>"))
        try await w.expectConverged()
    }

    @Test func binaryConflictKeepsBothFiles() async throws {
        let w = try await world { try $0.write("/img.bin", [0, 1, 2, 3]) }
        try w.a.write("/img.bin", [0, 9, 9, 9])
        try w.b.write("/img.bin", [0, 7, 7, 7])
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.vault.readAll(w.a.vault.resolve("/img.bin").id) == [0, 9, 9, 9])
        #expect(try w.a.vault.readAll(w.a.vault.resolve("/img-1.bin").id) == [0, 7, 7, 7])
        try await w.expectConverged()
    }

    @Test func binaryConflictCopyCollision() async throws {
        let w = try await world { d in
            try d.write("/img.bin", [0, 1])
            try d.write("/img-1.bin", [5])
        }
        try w.a.write("/img.bin", [0, 2])
        try w.b.write("/img.bin", [0, 3])
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.vault.readAll(w.a.vault.resolve("/img-2.bin").id) == [0, 3])
        #expect(try w.a.vault.readAll(w.a.vault.resolve("/img-1.bin").id) == [5])
        try await w.expectConverged()
    }

    @Test func identicalEditsOnBothSides() async throws {
        let w = try await world { try $0.write("/s.txt", "same") }
        try w.a.write("/s.txt", "changed")
        try w.b.write("/s.txt", "changed")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.ls() == ["s.txt"] && w.a.read("/s.txt") == "changed")
        try await w.expectConverged()
    }

    @Test func editAgainstRename() async throws {
        let w = try await world { try $0.write("/e.txt", "v1") }
        try w.a.write("/e.txt", "v2")
        try w.b.mv("/e.txt", "/renamed.txt")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.read("/renamed.txt") == "v2")
        try await w.expectConverged()
    }

    @Test func editAgainstMove() async throws {
        let w = try await world { d in
            try d.mkdir("/dst")
            try d.write("/e.txt", "v1")
        }
        try w.a.write("/e.txt", "v2")
        try w.b.mv("/e.txt", "/dst/e.txt")
        try await w.sync(w.b, w.a, w.b, w.a)
        #expect(try w.b.read("/dst/e.txt") == "v2")
        try await w.expectConverged()
    }

    @Test func textMergeWhereOneSideEmptiedTheFile() async throws {
        let w = try await world { try $0.write("/t.txt", "1\n2\n3\n") }
        try w.a.write("/t.txt", "")
        try w.b.write("/t.txt", "1\n2\n3\n4\n")
        try await w.sync(w.a, w.b, w.a, w.b)
        let merged = try w.a.read("/t.txt")
        #expect(merged.contains("4"))
        try await w.expectConverged()
    }

    @Test func editsToDifferentFilesBothLand() async throws {
        let w = try await world { d in
            try d.write("/1.txt", "1")
            try d.write("/2.txt", "2")
        }
        try w.a.write("/1.txt", "one")
        try w.b.write("/2.txt", "two")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.read("/1.txt") == "one" && w.a.read("/2.txt") == "two")
        try await w.expectConverged()
    }

    // MARK: Attributes

    /// B changes the mode after A. B's mode wins whichever device syncs first: were the first
    /// (or the last) to sync to win instead, one of the two orders would fail.
    @Test(arguments: [true, false]) func laterChmodWins(laterSyncsFirst: Bool) async throws {
        let w = try await world { try $0.write("/p.txt", "p") }
        try w.a.chmod("/p.txt", 0o600)
        usleep(5000)
        try w.b.chmod("/p.txt", 0o640)
        if laterSyncsFirst { try await w.sync(w.b, w.a, w.b, w.a) } else { try await w.sync(w.a, w.b, w.a, w.b) }
        #expect(try w.a.mode("/p.txt") == 0o640)
        try await w.expectConverged()
    }

    @Test func differentAttributesBothKept() async throws {
        let w = try await world { try $0.write("/p.txt", "p") }
        try w.a.chmod("/p.txt", 0o600)
        try w.b.touch("/p.txt", 1_234_567)
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.mode("/p.txt") == 0o600 && w.a.mtime("/p.txt") == 1_234_567)
        try await w.expectConverged()
    }

    @Test func atimeAndMtimeSetOnDifferentDevicesBothKept() async throws {
        let w = try await world { try $0.write("/p.txt", "p") }
        try w.a.touchAccess("/p.txt", 1_900_000_000)
        try w.b.touch("/p.txt", 1_950_000_000)
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.atime("/p.txt") == 1_900_000_000 && w.a.mtime("/p.txt") == 1_950_000_000)
        #expect(try w.b.atime("/p.txt") == 1_900_000_000 && w.b.mtime("/p.txt") == 1_950_000_000)
        // The later touch -a wins.
        try w.b.touchAccess("/p.txt", 1_000)
        usleep(5000)
        try w.a.touchAccess("/p.txt", 2_000)
        try await w.sync(w.b, w.a, w.b, w.a)
        #expect(try w.b.atime("/p.txt") == 2_000)
        try await w.expectConverged()
    }

    @Test func xattrsFromBothSides() async throws {
        let w = try await world { d in
            try d.write("/x.txt", "x")
            try d.setXattr("/x.txt", "user.old", "1")
        }
        try w.a.setXattr("/x.txt", "user.a", "from a")
        try w.b.setXattr("/x.txt", "user.b", "from b")
        try w.b.setXattr("/x.txt", "user.old", nil)
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.xattrs("/x.txt") == ["user.a": "from a", "user.b": "from b"])
        try await w.expectConverged()
    }

    @Test func editAgainstChmodKeepsBoth() async throws {
        let w = try await world { try $0.write("/c.txt", "v1") }
        try w.a.write("/c.txt", "v2")
        try w.b.chmod("/c.txt", 0o700)
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.b.read("/c.txt") == "v2" && w.b.mode("/c.txt") == 0o700)
        try await w.expectConverged()
    }
}

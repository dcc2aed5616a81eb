import CofferTestSupport
import CofferVault
import Foundation
import Testing

@Suite(.serialized) struct MoreSyncScenarios {
    func world(devices: Int = 2, _ setup: (Device) throws -> Void) async throws -> SyncWorld {
        let w = try await SyncWorld(devices: devices)
        try setup(w.a)
        for d in w.devices { try await d.sync() }
        return w
    }

    @Test func threeDevicesCreateTheSameName() async throws {
        let w = try await SyncWorld(devices: 3)
        try w.a.write("/n.txt", "a")
        try w.b.write("/n.txt", "b")
        try w.c.write("/n.txt", "c")
        try await w.sync(w.a, w.b, w.c)
        try await w.expectConverged()
        #expect(try w.a.ls() == ["n-1.txt", "n-2.txt", "n.txt"])
        #expect(Set(try ["n.txt", "n-1.txt", "n-2.txt"].map { try w.a.read("/" + $0) }) == ["a", "b", "c"])
    }

    @Test func swapNamesWhileOtherEdits() async throws {
        let w = try await world { d in
            try d.write("/a.txt", "A")
            try d.write("/b.txt", "B")
        }
        try w.a.mv("/a.txt", "/tmp.txt")
        try w.a.mv("/b.txt", "/a.txt")
        try w.a.mv("/tmp.txt", "/b.txt")
        try w.b.write("/a.txt", "A edited")
        try await w.sync(w.a, w.b, w.a, w.b)
        // The edit follows the file, which is now called b.txt.
        #expect(try w.a.read("/b.txt") == "A edited" && w.a.read("/a.txt") == "B")
        try await w.expectConverged()
    }

    @Test func deleteParentAndChildConcurrently() async throws {
        let w = try await world { d in
            try d.mkdir("/p")
            try d.write("/p/c.txt", "c")
        }
        try w.a.rm("/p")
        try w.b.rm("/p/c.txt")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.b.ls() == [])
        try await w.expectConverged()
    }

    @Test func moveIntoAFolderDeletedFirstElsewhere() async throws {
        let w = try await world { d in
            try d.mkdir("/F")
            try d.write("/f.txt", "f")
        }
        try w.b.rm("/F")
        try w.a.mv("/f.txt", "/F/f.txt")
        try await w.sync(w.b, w.a, w.b, w.a)
        #expect(try w.a.ls() == [])
        try await w.expectConverged()
    }

    @Test func editTwiceBetweenSyncs() async throws {
        let w = try await world { try $0.write("/t.txt", "1") }
        try w.a.write("/t.txt", "2")
        try w.a.write("/t.txt", "3")
        try await w.sync(w.a, w.b)
        #expect(try w.b.read("/t.txt") == "3")
        try await w.expectConverged()
    }

    @Test func manyFilesOnBothSides() async throws {
        let w = try await SyncWorld()
        for i in 0..<40 {
            try w.a.write("/a\(i).txt", "a\(i)")
            try w.b.write("/b\(i).txt", "b\(i)")
        }
        try await w.sync(w.a, w.b, w.a)
        #expect(try w.a.ls().count == 80)
        try await w.expectConverged()
    }

    @Test func folderRenamedDifferentlyOnBoth() async throws {
        let w = try await world { d in
            try d.mkdir("/dir")
            try d.write("/dir/x", "x")
        }
        try w.a.mv("/dir", "/dirA")
        try w.b.mv("/dir", "/dirB")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.b.ls() == ["dirA"] && w.b.read("/dirA/x") == "x")
        try await w.expectConverged()
    }

    @Test func sameChmodOnBoth() async throws {
        let w = try await world { try $0.write("/m", "m") }
        try w.a.chmod("/m", 0o700)
        try w.b.chmod("/m", 0o700)
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.mode("/m") == 0o700)
        try await w.expectConverged()
    }

    /// B sets the value after A. B's value wins whichever device syncs first: were the first (or
    /// the last) to sync to win instead, one of the two orders would fail.
    @Test(arguments: [true, false]) func sameXattrDifferentValuesLaterWins(laterSyncsFirst: Bool) async throws {
        let w = try await world { try $0.write("/x", "x") }
        try w.a.setXattr("/x", "user.color", "red")
        usleep(5000)
        try w.b.setXattr("/x", "user.color", "green")
        if laterSyncsFirst { try await w.sync(w.b, w.a, w.b, w.a) } else { try await w.sync(w.a, w.b, w.a, w.b) }
        #expect(try w.a.xattrs("/x") == ["user.color": "green"])
        #expect(try w.b.xattrs("/x") == ["user.color": "green"])
        try await w.expectConverged()
    }

    @Test func deletedFileAndNewFolderOfTheSameName() async throws {
        let w = try await world { try $0.write("/thing", "file") }
        try w.a.rm("/thing")
        try w.a.mkdir("/thing")
        try w.b.chmod("/thing", 0o600)
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.b.vault.resolve("/thing").type == .folder)
        try await w.expectConverged()
    }

    @Test func textMergeAcrossThreeDevices() async throws {
        let base = (1...30).map { "l\($0)\n" }.joined()
        let w = try await world(devices: 3) { try $0.write("/m.txt", base) }
        try w.a.write("/m.txt", base.replacingOccurrences(of: "l2\n", with: "A\n"))
        try w.b.write("/m.txt", base.replacingOccurrences(of: "l15\n", with: "B\n"))
        try w.c.write("/m.txt", base.replacingOccurrences(of: "l28\n", with: "C\n"))
        try await w.sync(w.a, w.b, w.c)
        try await w.expectConverged()
        let m = try w.a.read("/m.txt")
        #expect(m.contains("A\n") && m.contains("B\n") && m.contains("C\n") && !m.contains("<<<<"))
    }

    @Test func moveChainsAcrossFolders() async throws {
        let w = try await world { d in
            try d.mkdir("/1")
            try d.mkdir("/2")
            try d.mkdir("/3")
            try d.write("/1/f", "f")
        }
        try w.a.mv("/1/f", "/2/f")
        try w.b.mv("/2", "/3/2")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.a.read("/3/2/f") == "f")
        try await w.expectConverged()
    }

    @Test func offlineEditsOnBothWhileTheOtherSyncsManyTimes() async throws {
        let w = try await world { d in for i in 0..<10 { try d.write("/f\(i).txt", "base \(i)\n") } }
        for round in 0..<5 {
            try w.a.write("/f\(round).txt", "a round \(round)\n")
            try await w.a.sync()
        }
        try w.b.write("/f0.txt", "b offline\n")
        try w.b.write("/f9.txt", "b offline 9\n")
        try await w.sync(w.b, w.a, w.b)
        let f0 = try w.a.read("/f0.txt")
        #expect(f0.contains("a round 0") && f0.contains("b offline"))
        #expect(try w.a.read("/f9.txt") == "b offline 9\n")
        try await w.expectConverged()
    }
}

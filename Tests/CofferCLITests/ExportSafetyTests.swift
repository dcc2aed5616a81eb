import CofferTestSupport
import Foundation
import Testing

/// `coffer export` writes files as whoever runs it, so it must not hand out privileges the
/// files' writer never had, and it must work on a fresh machine (issue 19, defect 10).
@Suite struct ExportSafetyTests {
    @Test func setuidAndSetgidBitsAreNotKeptWhenOwnershipIsNotRestored() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        let src = tmp.sub("src")
        try FileManager.default.createDirectory(atPath: src + "/shared", withIntermediateDirectories: true)
        try Data("#!/bin/sh\nid\n".utf8).write(to: URL(fileURLWithPath: src + "/shared/tool"))
        try Data("plain\n".utf8).write(to: URL(fileURLWithPath: src + "/shared/sticky-note"))
        // Another user's setuid+setgid program, in a setgid folder: what an attacker leaves for root.
        chown(src + "/shared/tool", 65534, 65534)
        #expect(chmod(src + "/shared/tool", 0o6755) == 0)
        #expect(chmod(src + "/shared", 0o2755) == 0)
        #expect(chmod(src + "/shared/sticky-note", 0o1644) == 0)
        #expect(coffer(data, ["init", "carol"]).status == 0)
        let imp = coffer(data, ["import", src + "/shared", "shared"])
        #expect(imp.status == 0, "\(imp.err)")

        let out = tmp.sub("out")
        let exp = coffer(data, ["export", "shared", out])
        #expect(exp.status == 0, "\(exp.err)")
        let tool = try #require(lstatOf(out + "/shared/tool"))
        // What `cp` (without -p) gives: the permission bits without setuid and setgid.
        #expect(UInt32(tool.st_mode) & 0o7777 == 0o755, "mode \(String(UInt32(tool.st_mode) & 0o7777, radix: 8))")
        let folder = try #require(lstatOf(out + "/shared"))
        #expect(UInt32(folder.st_mode) & 0o7777 == 0o755, "mode \(String(UInt32(folder.st_mode) & 0o7777, radix: 8))")
        // The sticky bit gives nobody anything and is kept, like the rest of the mode.
        let note = try #require(lstatOf(out + "/shared/sticky-note"))
        #expect(UInt32(note.st_mode) & 0o7777 == 0o1644)
        #expect((try? String(contentsOfFile: out + "/shared/tool", encoding: .utf8)) == "#!/bin/sh\nid\n")
    }

    @Test func exportCreatesAMissingDestinationFolder() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        #expect(coffer(data, ["init", "dave"]).status == 0)
        #expect(coffer(data, ["mkdir", "-p", "photos/2024"]).status == 0)
        #expect(coffer(data, ["write", "photos/2024/a.jpg"], stdin: Array("jpeg".utf8)).status == 0)
        // The README's `coffer export photos /tmp/restore`, on a machine with no /tmp/restore yet
        // (and its parent missing too).
        let restore = tmp.path + "/fresh/restore"
        let exp = coffer(data, ["export", "photos", restore])
        #expect(exp.status == 0, "\(exp.err)")
        #expect((try? String(contentsOfFile: restore + "/photos/2024/a.jpg", encoding: .utf8)) == "jpeg")
        // A destination that exists but is a file is still refused, with one clear line.
        try Data("x".utf8).write(to: URL(fileURLWithPath: tmp.path + "/afile"))
        let bad = coffer(data, ["export", "photos", tmp.path + "/afile"])
        #expect(bad.status == 1)
        #expect(bad.err.contains("is not a folder"), "\(bad.err)")
    }
}

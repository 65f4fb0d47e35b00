"""Who may do what at each door (:mod:`spamnb.delivery.access`): the one rule every
listener asks. The listeners' own tests (test_server, test_spamd, test_web,
test_prometheus, test_hardening) hold each door's answers end to end."""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket

import pytest

from spamnb.delivery import access
from spamnb.delivery.access import (CHECK, CONNECT, LEARN_OWN, LEARN_SHARED, METRICS, NAME_USER, READ_METRICS,
                                    READ_PAGE, SOCKET, SPAMD, TEACH_PAGE, WEB, Peer, Rules)

LAN = (ipaddress.ip_network("192.0.2.0/24"),)


def own_non_loopback_address():
    """An address of this machine that is not loopback (the one it would send from to a
    documentation network: a UDP connect sends nothing), or None."""
    for probe in ("192.0.2.1", "198.51.100.1", "203.0.113.1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                ip = s.getsockname()[0]
        except OSError:
            continue
        if not ipaddress.ip_address(ip).is_loopback:
            return ip
    return None


def test_each_door_offers_its_own_actions_only():
    me = os.geteuid()
    socket_peer = Peer(SOCKET, uid=me)
    assert all(Rules().allows(socket_peer, a) for a in (CONNECT, CHECK, LEARN_OWN, LEARN_SHARED))
    assert not Rules().allows(socket_peer, NAME_USER, user="bob")
    assert not Rules().allows(Peer(SOCKET, uid=me + 1), CONNECT)  # the socket is its owner's alone
    assert not Rules().allows(Peer(SOCKET, uid=me + 1), CHECK)
    page = Peer(WEB, address="127.0.0.1")
    assert Rules().allows(page, CONNECT) and not Rules().allows(page, READ_PAGE)
    assert Rules().allows(Peer(WEB, address="127.0.0.1", key=True), READ_PAGE)
    assert not Rules().allows(Peer(WEB, address="127.0.0.1", key=True), TEACH_PAGE)  # no CSRF token
    assert Rules().allows(Peer(WEB, address="127.0.0.1", key=True, csrf=True), TEACH_PAGE)
    assert not Rules().allows(Peer(WEB, address="127.0.0.1", key=True, csrf=True), READ_METRICS)
    assert Rules().allows(Peer(METRICS, address="::1"), READ_METRICS)
    assert not Rules().allows(Peer(METRICS, address="::1"), READ_PAGE)


def test_a_tcp_peer_comes_from_loopback_or_the_allowed_networks():
    for door, action in ((SPAMD, CONNECT), (METRICS, READ_METRICS), (WEB, CONNECT)):
        assert Rules().allows(Peer.tcp(door, ("127.0.0.1", 1)), action)
        assert Rules().allows(Peer.tcp(door, ("::ffff:127.0.0.1", 1, 0, 0)), action)
        assert not Rules().allows(Peer.tcp(door, ("192.0.2.5", 1)), action)
        assert not Rules().allows(Peer.tcp(door, ("::ffff:192.0.2.5", 1, 0, 0)), action)
        assert Rules(networks=access.LOOPBACK + LAN).allows(Peer.tcp(door, ("192.0.2.5", 1)), action)
        # and a peer outside them may do nothing else either, key or not
        assert not Rules().allows(Peer.tcp(door, ("192.0.2.5", 1), key=True, csrf=True), READ_PAGE)


def test_tell_needs_its_switches_and_names_only_the_peers_own_user():
    me = pwd.getpwuid(os.geteuid())
    other = next((u for u in pwd.getpwall() if access.login_user(u.pw_uid) and u.pw_uid != os.geteuid()), None)
    off, tell, served = Rules(), Rules(tell=True), Rules(tell=True, tell_served=True)
    unix = Peer(SPAMD, uid=os.geteuid())
    assert not off.allows(unix, LEARN_OWN) and tell.allows(unix, LEARN_OWN)
    assert not tell.allows(unix, LEARN_SHARED) and served.allows(unix, LEARN_SHARED)
    assert tell.allows(unix, NAME_USER, user=me.pw_name)
    assert tell.allows(Peer(SPAMD, uid=0), NAME_USER, user="bob")  # root: an MTA
    assert tell.refusal(Peer(SPAMD, uid=access.UNKNOWN_PEER), NAME_USER, user="bob") == (
        "the connecting process on this machine could not be identified (its socket is gone)")
    assert tell.allows(Peer.tcp(SPAMD, ("192.0.2.5", 1)), NAME_USER, user="bob") is False  # not admitted
    lan = Rules(networks=access.LOOPBACK + LAN, tell=True)
    assert lan.allows(Peer(SPAMD, address="192.0.2.5"), NAME_USER, user="bob")  # another host: as sent
    # a peer whose connection was not given: its user cannot be told, it is never another host's
    assert not lan.allows(Peer.tcp(SPAMD, ("192.0.2.5", 1)), NAME_USER, user="bob")
    if other is not None:
        stranger = Peer(SPAMD, uid=other.pw_uid)
        assert tell.refusal(stranger, NAME_USER, user="bob") == (
            f"the connecting process runs as another user (uid {other.pw_uid})")
        assert tell.allows(stranger, NAME_USER, user=other.pw_name)
        assert Rules(tell=True, owner=other.pw_uid).allows(stranger, NAME_USER, user="bob")  # the server's user


def test_a_peer_from_this_machines_own_address_is_local():
    """A client on this machine that connects from (or to) one of its addresses other
    than loopback is on this machine all the same: its user is the socket table's, not
    "another host" (whose User: is taken as sent)."""
    ip = own_non_loopback_address()
    if ip is None:
        pytest.skip("this machine has no address but loopback")
    assert access.is_local_address(ip)
    assert access.is_local_address("127.0.0.1") and access.is_local_address("::1")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with socket.socket() as client:
            client.bind((ip, 0))  # from the host's own address to its loopback
            client.connect(listener.getsockname())
            conn, address = listener.accept()
            with conn:
                assert address[0] == ip
                assert access.tcp_peer_uid(conn, address) == os.geteuid()
                peer = Peer.tcp(SPAMD, address, conn)
                rules = Rules(networks=access.LOOPBACK + (ipaddress.ip_network(ip),), tell=True)
                assert peer.uid == os.geteuid()
                assert rules.allows(peer, NAME_USER, user="bob")  # the server's own user


def test_an_address_not_of_this_machine_is_another_hosts():
    ours = own_non_loopback_address()
    theirs = next(a for a in ("198.51.100.254", "203.0.113.254") if a != ours)
    assert not access.is_local_address(theirs)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with socket.create_connection(listener.getsockname()):
            conn, _ = listener.accept()
            with conn:
                assert access.tcp_peer_uid(conn, (theirs, 1)) is None  # as accept() would give it


def test_a_trusted_user_may_name_anyone_from_this_machine_and_shares_are_half():
    import pwd

    other = _a_person()
    peer = access.Peer(access.SPAMD, uid=other.pw_uid)
    rules = access.Rules(tell=True)
    assert "another user" in rules.refusal(peer, access.NAME_USER, user="bob")
    assert rules.allows(peer, access.NAME_USER, user=other.pw_name)
    assert access.Rules(trusted=(other.pw_name,)).allows(peer, access.NAME_USER, user="bob")
    assert access.Rules(trusted=("bob",)).refusal(peer, access.NAME_USER, user="bob")  # not the peer's name
    allowed = access.Rules(networks=access.LOOPBACK + (ipaddress.ip_network("192.0.2.0/24"),))
    assert allowed.allows(access.Peer(access.SPAMD, address="192.0.2.1", uid=None), access.NAME_USER,
                          user="bob")  # another host in --allow: as sent
    assert [access.share(n) for n in (1, 2, 3, 32, 64)] == [1, 1, 1, 16, 32]
    assert access.holder(peer) == ("uid", other.pw_uid)
    assert access.holder(access.Peer(access.SPAMD, address="192.0.2.1", uid=None)) == ("address", "192.0.2.1")


def test_no_share_binds_root_the_servers_user_or_a_trusted_user():
    """The MTA sends everyone's mail from one user: once trusted, only --max-connections binds it."""
    import pwd

    other = _a_person()
    peer = access.Peer(access.SPAMD, uid=other.pw_uid)
    assert access.Rules().holder(peer) == ("uid", other.pw_uid)
    assert access.Rules(trusted=(other.pw_name,)).holder(peer) == access.UNBOUND
    assert access.Rules().holder(access.Peer(access.SPAMD, uid=0)) == access.UNBOUND
    assert access.Rules().holder(access.Peer(access.SPAMD, uid=os.geteuid())) == access.UNBOUND
    assert access.Rules().holder(access.Peer(access.SPAMD, address="192.0.2.1", uid=None)) == ("address", "192.0.2.1")


def _a_person():
    """A person's account of this machine (uid within login.defs' range), not ours."""
    import pwd

    found = next((p for p in pwd.getpwall() if access.login_user(p.pw_uid) and p.pw_uid != os.geteuid()), None)
    if found is None:
        pytest.skip("no person's account on this machine (a uid from UID_MIN to UID_MAX) besides ours")
    return found


def test_a_system_user_may_name_anyone_a_person_only_themselves():
    """The mail system runs spamc -u RECIPIENT as a system user (Postfix's pipe as nobody, Exim
    as Debian-exim): it names anyone; a person's account (the local attacker) only itself."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    assert not access.login_user(nobody.pw_uid) and not access.login_user(1) and access.login_user(1000)
    rules = access.Rules()
    assert rules.allows(access.Peer(access.SPAMD, uid=nobody.pw_uid), access.NAME_USER, user="bob")
    assert rules.holder(access.Peer(access.SPAMD, uid=nobody.pw_uid)) == access.UNBOUND
    person = _a_person()
    assert "another user" in rules.refusal(access.Peer(access.SPAMD, uid=person.pw_uid), access.NAME_USER,
                                           user="bob" if person.pw_name != "bob" else "carol")

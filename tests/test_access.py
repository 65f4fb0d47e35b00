"""Who may do what at each door (:mod:`spamnb.delivery.access`): the one rule every
listener asks. The listeners' own tests (test_server, test_spamd, test_web,
test_prometheus, test_hardening) hold each door's answers end to end."""

from __future__ import annotations

import ipaddress
import os
import pwd

from spamnb.delivery import access
from spamnb.delivery.access import (CHECK, CONNECT, LEARN_OWN, LEARN_SHARED, METRICS, NAME_USER, READ_METRICS,
                                    READ_PAGE, SOCKET, SPAMD, TEACH_PAGE, WEB, Peer, Rules)

LAN = (ipaddress.ip_network("192.0.2.0/24"),)


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
    other = next((u for u in pwd.getpwall() if u.pw_uid not in (0, os.geteuid())), None)
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
    if other is not None:
        stranger = Peer(SPAMD, uid=other.pw_uid)
        assert tell.refusal(stranger, NAME_USER, user="bob") == (
            f"the connecting process runs as another user (uid {other.pw_uid})")
        assert tell.allows(stranger, NAME_USER, user=other.pw_name)
        assert Rules(tell=True, owner=other.pw_uid).allows(stranger, NAME_USER, user="bob")  # the server's user


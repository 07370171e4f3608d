"""cell"""

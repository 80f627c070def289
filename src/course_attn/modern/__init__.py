"""modern"""
